//! Builds the C spawners of the spawn-site shapes (`src/bin/shapes/spawner.c`) twice: with
//! frame pointers and without, as a C gateway may be built.
fn main() {
    let source = "src/bin/shapes/spawner.c";
    println!("cargo::rerun-if-changed={source}");
    let builds = [
        ("fp", "-fno-omit-frame-pointer"),
        ("nofp", "-fomit-frame-pointer"),
    ];
    for (name, frame_pointers) in builds {
        cc::Build::new()
            .file(source)
            .define("SPAWN_FN", format!("spawn_leaky_helper_{name}").as_str())
            .define(
                "SPAWN_OTHER_FN",
                format!("spawn_other_helper_{name}").as_str(),
            )
            .opt_level(2)
            .debug(true)
            .flag(frame_pointers)
            // reaper-shapes links it by its own `#[link]` (a build script's link lines reach
            // the package's library only).
            .cargo_metadata(false)
            .compile(&format!("spawner_{name}"));
    }
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    println!("cargo::rustc-link-search=native={out}");
}
