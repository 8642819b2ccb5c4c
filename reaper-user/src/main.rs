//! `reaper-trace`: the library's [`reaper_user::main`], which reads the command line.
fn main() {
    reaper_user::main()
}
