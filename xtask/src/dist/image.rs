//! The OCI image `dist` makes (an image per architecture, one index of both) and the
//! binary of one platform's image read back as a runtime reads it.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{VERSION, elf_shape, install, sh, tar, write};
use crate::arch::Arch;

/// The OCI image: for each architecture an image of its binary alone (umoci: no daemon, no
/// base image), and one image index naming both by platform, the archive's only image: a
/// reference to it (`oci-archive:FILE`, `reaper-trace:VERSION` once loaded) is resolved per
/// node to the image of the node's platform.
pub(super) fn image(out: &Path, binaries: &[(Arch, PathBuf)]) -> Result<PathBuf> {
    let layout = out.join("oci");
    sh(Command::new("umoci")
        .args(["init", "--layout"])
        .arg(&layout))?;
    let mut images = Vec::new();
    for (arch, binary) in binaries {
        let name = format!("reaper-trace:{VERSION}-{}", arch.deb());
        let tag = format!("{}:{name}", layout.display());
        sh(Command::new("umoci").args(["new", "--image", &tag]))?;
        // The layer is GNU tar's, whole: umoci 0.4.7's `insert` ends its tar inside the last
        // file's padding, which Go's archive/tar (containerd's) refuses as an unexpected EOF.
        let stage = out.join(format!("layer-{}", arch.deb()));
        install(binary, &stage.join("usr/bin/reaper-trace"), 0o755)?;
        let layer = out.join(format!("layer-{}.tar", arch.deb()));
        tar(&layer, &stage, "usr")?;
        sh(Command::new("umoci")
            .args(["raw", "add-layer", "--image", &tag])
            .arg(&layer))?;
        sh(Command::new("umoci").args([
            "config",
            "--image",
            &tag,
            "--config.entrypoint",
            "/usr/bin/reaper-trace",
            "--config.user",
            "0",
            "--config.workingdir",
            "/",
            "--config.label",
            &format!("org.opencontainers.image.version={VERSION}"),
            "--config.label",
            "org.opencontainers.image.title=reaper-trace",
            "--config.label",
            "org.opencontainers.image.licenses=MIT OR Apache-2.0",
            "--os",
            "linux",
            // OCI's names of these two architectures are Debian's.
            "--architecture",
            arch.deb(),
        ]))?;
        images.push((*arch, name));
    }
    sh(Command::new("umoci").args(["gc", "--layout"]).arg(&layout))?;
    index_images(&layout, &images)?;
    // An OCI archive is the layout in a tar.
    let archive = out.join(format!("reaper-trace-{VERSION}-oci.tar"));
    tar(&archive, &layout, ".")?;
    Ok(archive)
}

const REF_NAME: &str = "org.opencontainers.image.ref.name";
const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";

/// Replaces the layout's images, each named `(arch, name)` in its `index.json`, by one image
/// index holding them by platform (a blob of the layout), named `reaper-trace:VERSION`.
fn index_images(layout: &Path, images: &[(Arch, String)]) -> Result<()> {
    let top_path = layout.join("index.json");
    let top: Value = serde_json::from_slice(&fs::read(&top_path)?)
        .with_context(|| format!("reading {}", top_path.display()))?;
    let listed = top["manifests"]
        .as_array()
        .context("index.json lists no manifests")?;
    let mut manifests = Vec::new();
    for (arch, name) in images {
        let mut manifest = listed
            .iter()
            .find(|m| m["annotations"][REF_NAME] == name.as_str())
            .with_context(|| format!("umoci made no image {name}"))?
            .clone();
        manifest
            .as_object_mut()
            .context("a manifest's descriptor")?
            .remove("annotations");
        manifest["platform"] = json!({ "architecture": arch.deb(), "os": "linux" });
        manifests.push(manifest);
    }
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA_TYPE,
        "manifests": manifests,
    }))?;
    let digest = format!("{:x}", Sha256::digest(&index));
    write(&layout.join("blobs/sha256").join(&digest), &index, 0o644)?;
    let top = json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": INDEX_MEDIA_TYPE,
            "digest": format!("sha256:{digest}"),
            "size": index.len(),
            "annotations": { REF_NAME: format!("reaper-trace:{VERSION}") },
        }],
    });
    write(&top_path, serde_json::to_vec(&top)?, 0o644)
}

/// The binary of the image for `arch` in the OCI archive `archive`, read as a runtime reads
/// it (the archive's one index, its manifest for `linux/arch`, that manifest's layers, each
/// blob checked against its descriptor's size and digest), and unpacked under `into`: what a
/// node of that architecture runs.
pub fn image_binary(archive: &Path, arch: Arch, into: &Path) -> Result<PathBuf> {
    let dir = into.join(format!("image-{}", arch.deb()));
    let _ = fs::remove_dir_all(&dir);
    let rootfs = dir.join("rootfs");
    fs::create_dir_all(&rootfs)?;
    sh(Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(&dir))?;
    let json_at = |path: PathBuf| -> Result<Value> {
        serde_json::from_slice(&fs::read(&path)?)
            .with_context(|| format!("reading {}", path.display()))
    };
    let blob = |descriptor: &Value| -> Result<PathBuf> {
        let digest = descriptor["digest"]
            .as_str()
            .context("a descriptor's digest")?;
        let hex = digest.strip_prefix("sha256:").context("a sha256 digest")?;
        // Checked against its descriptor, as a runtime checks what it pulls.
        let path = dir.join("blobs/sha256").join(hex);
        let bytes = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        if descriptor["size"].as_u64() != Some(bytes.len() as u64)
            || format!("{:x}", Sha256::digest(&bytes)) != hex
        {
            bail!("the blob {digest} is not the one its descriptor names");
        }
        Ok(path)
    };
    let top = json_at(dir.join("index.json"))?;
    let index = json_at(blob(&top["manifests"][0])?)?;
    let manifest = index["manifests"]
        .as_array()
        .context("the image index lists no manifests")?
        .iter()
        .find(|m| m["platform"]["os"] == "linux" && m["platform"]["architecture"] == arch.deb())
        .with_context(|| format!("the image index has no linux/{}", arch.deb()))?;
    let manifest = json_at(blob(manifest)?)?;
    for layer in manifest["layers"]
        .as_array()
        .context("a manifest's layers")?
    {
        sh(Command::new("tar")
            .arg("-xzf")
            .arg(blob(layer)?)
            .arg("-C")
            .arg(&rootfs))?;
    }
    let binary = rootfs.join("usr/bin/reaper-trace");
    let elf = fs::read(&binary).with_context(|| format!("reading {}", binary.display()))?;
    let machine = elf_shape(&elf).map(|shape| shape.machine);
    if machine != Some(arch.elf_machine()) {
        bail!("the image's linux/{} binary is not its code", arch.deb());
    }
    Ok(binary)
}
