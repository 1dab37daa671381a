//! Tests of the OCI / docker-save importer. They need root (chown, mknod of
//! whiteouts, `trusted.*` xattrs, overlay mounts), as in CI.

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use sandbox::oci::{import, ImportLimits, ImportedImage, OciError};
use serde_json::json;
use sha2::{Digest, Sha256};
use tar::EntryType;

const MTIME: u64 = 1_600_000_000;

// ---------------------------------------------------------------------------
// Building tars and images
// ---------------------------------------------------------------------------

#[derive(Clone)]
struct Ent {
    path: String,
    kind: EntryType,
    data: Vec<u8>,
    mode: u32,
    uid: u64,
    gid: u64,
    link: Option<String>,
    dev: (u32, u32),
}

fn ent(path: &str, kind: EntryType, data: &[u8], mode: u32) -> Ent {
    Ent {
        path: path.into(),
        kind,
        data: data.to_vec(),
        mode,
        uid: 0,
        gid: 0,
        link: None,
        dev: (0, 0),
    }
}
fn dir(p: &str, mode: u32) -> Ent {
    ent(p, EntryType::Directory, b"", mode)
}
fn file(p: &str, data: &[u8], mode: u32) -> Ent {
    ent(p, EntryType::Regular, data, mode)
}
fn sym(p: &str, target: &str) -> Ent {
    Ent {
        link: Some(target.into()),
        ..ent(p, EntryType::Symlink, b"", 0o777)
    }
}
fn hard(p: &str, target: &str) -> Ent {
    Ent {
        link: Some(target.into()),
        ..ent(p, EntryType::Link, b"", 0o644)
    }
}
fn chr(p: &str, major: u32, minor: u32) -> Ent {
    Ent {
        dev: (major, minor),
        ..ent(p, EntryType::Char, b"", 0o600)
    }
}
fn blk(p: &str) -> Ent {
    Ent {
        dev: (8, 0),
        ..ent(p, EntryType::Block, b"", 0o600)
    }
}
fn fifo(p: &str) -> Ent {
    ent(p, EntryType::Fifo, b"", 0o640)
}
impl Ent {
    fn owner(mut self, uid: u64, gid: u64) -> Self {
        self.uid = uid;
        self.gid = gid;
        self
    }
}

/// Builds a tar with raw names (no sanitising: hostile names are kept).
fn tar_of(entries: &[Ent]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        assert!(e.path.len() < 100, "test path too long");
        h.as_old_mut().name[..e.path.len()].copy_from_slice(e.path.as_bytes());
        if let Some(l) = &e.link {
            h.as_old_mut().linkname[..l.len()].copy_from_slice(l.as_bytes());
        }
        h.set_entry_type(e.kind);
        h.set_size(e.data.len() as u64);
        h.set_mode(e.mode);
        h.set_uid(e.uid);
        h.set_gid(e.gid);
        h.set_mtime(MTIME);
        h.set_device_major(e.dev.0).unwrap();
        h.set_device_minor(e.dev.1).unwrap();
        h.set_cksum();
        b.append(&h, e.data.as_slice()).unwrap();
    }
    b.into_inner().unwrap()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

/// A layer as stored in the image: its uncompressed tar and the blob bytes.
#[derive(Clone)]
struct Layer {
    tar: Vec<u8>,
    blob: Vec<u8>,
    media_type: String,
}

fn plain(tar: Vec<u8>) -> Layer {
    Layer {
        blob: tar.clone(),
        tar,
        media_type: "application/vnd.oci.image.layer.v1.tar".into(),
    }
}
fn gz(tar: Vec<u8>) -> Layer {
    Layer {
        blob: gzip(&tar),
        tar,
        media_type: "application/vnd.oci.image.layer.v1.tar+gzip".into(),
    }
}

fn config_json(layers: &[Layer]) -> serde_json::Value {
    json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": ["PATH=/usr/bin:/bin", "LANG=C.UTF-8"],
            "WorkingDir": "/work",
            "Entrypoint": ["/bin/sh", "-c"],
            "Cmd": ["echo hi"]
        },
        "rootfs": {
            "type": "layers",
            "diff_ids": layers.iter().map(|l| format!("sha256:{}", sha(&l.tar))).collect::<Vec<_>>()
        }
    })
}

fn write_blob(layout: &Path, data: &[u8]) -> String {
    let d = layout.join("blobs/sha256");
    std::fs::create_dir_all(&d).unwrap();
    let h = sha(data);
    std::fs::write(d.join(&h), data).unwrap();
    format!("sha256:{h}")
}

/// Options to make an OCI layout deliberately wrong.
#[derive(Default)]
struct Tweaks {
    /// Replace layer i's descriptor digest (the blob is stored under it).
    layer_digest: Option<(usize, String)>,
    /// Replace the config's diff ids.
    diff_ids: Option<Vec<String>>,
    /// Do not write layer blobs.
    skip_layer_blobs: bool,
}

fn oci_layout(dir: &Path, layers: &[Layer], tw: Tweaks) -> String {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let mut descs = Vec::new();
    for (i, l) in layers.iter().enumerate() {
        let digest = match &tw.layer_digest {
            Some((j, d)) if *j == i => {
                let hex = d.strip_prefix("sha256:").unwrap();
                let p = dir.join("blobs/sha256");
                std::fs::create_dir_all(&p).unwrap();
                if !tw.skip_layer_blobs {
                    std::fs::write(p.join(hex), &l.blob).unwrap();
                }
                d.clone()
            }
            _ if tw.skip_layer_blobs => format!("sha256:{}", sha(&l.blob)),
            _ => write_blob(dir, &l.blob),
        };
        descs.push(json!({"mediaType": l.media_type, "digest": digest, "size": l.blob.len()}));
    }
    let mut config = config_json(layers);
    if let Some(ids) = tw.diff_ids {
        config["rootfs"]["diff_ids"] = json!(ids);
    }
    let config = serde_json::to_vec(&config).unwrap();
    let cdigest = write_blob(dir, &config);
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cdigest, "size": config.len()},
        "layers": descs,
    }))
    .unwrap();
    let mdigest = write_blob(dir, &manifest);
    let index = json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": mdigest,
            "size": manifest.len(),
            "annotations": {"org.opencontainers.image.ref.name": "latest"}
        }]
    });
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    mdigest
}

/// A legacy `docker save` archive: `<id>/layer.tar`, `<id>.json`, manifest.json.
fn docker_archive(layers: &[Layer]) -> Vec<u8> {
    let config = serde_json::to_vec(&config_json(layers)).unwrap();
    let cname = format!("{}.json", sha(&config));
    let mut b = tar::Builder::new(Vec::new());
    let add = |b: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(EntryType::Regular);
        b.append_data(&mut h, path, data).unwrap();
    };
    let mut paths = Vec::new();
    for l in layers {
        let id = sha(&l.tar);
        let p = format!("{id}/layer.tar");
        add(&mut b, &format!("{id}/VERSION"), b"1.0");
        add(&mut b, &p, &l.tar);
        paths.push(p);
    }
    add(&mut b, &cname, &config);
    let manifest = json!([{"Config": cname, "RepoTags": ["test:latest"], "Layers": paths}]);
    add(
        &mut b,
        "manifest.json",
        &serde_json::to_vec(&manifest).unwrap(),
    );
    add(&mut b, "repositories", br#"{"test":{"latest":"x"}}"#);
    b.into_inner().unwrap()
}

// ---------------------------------------------------------------------------
// The reference two-layer image
// ---------------------------------------------------------------------------

fn lower() -> Vec<u8> {
    tar_of(&[
        dir("./", 0o755),
        dir("etc/", 0o755),
        file("etc/keep", b"keep v1\n", 0o644),
        file("etc/gone", b"to be deleted\n", 0o600),
        hard("etc/keep.hard", "etc/keep"),
        dir("bin/", 0o755),
        file("bin/su", b"#!setuid\n", 0o4755),
        sym("bin/sh", "/bin/busybox"),
        sym("bin/rel", "../etc/keep"),
        dir("opq/", 0o750),
        file("opq/old", b"old\n", 0o644),
        file("home/user/notes.txt", b"notes\n", 0o640).owner(1000, 1001),
        fifo("run/fifo"),
    ])
}

fn upper() -> Vec<u8> {
    tar_of(&[
        dir("etc/", 0o755),
        file("etc/.wh.gone", b"", 0o644),
        file("etc/keep", b"keep v2\n", 0o644),
        dir("opq/", 0o750),
        file("opq/.wh..wh..opq", b"", 0o644),
        file("opq/new", b"new\n", 0o644),
    ])
}

fn layer_id(tar: &[u8]) -> String {
    format!("sha256-{}", sha(tar))
}

/// Describes a tree exactly: one line per path, sorted.
fn tree(root: &Path) -> Vec<String> {
    fn rec(root: &Path, dir: &Path, out: &mut Vec<String>) {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        for n in names {
            let p = dir.join(&n);
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let ft = m.file_type();
            let perm = m.mode() & 0o7777;
            if ft.is_dir() {
                out.push(format!("d {perm:o} {}:{} {rel}", m.uid(), m.gid()));
                rec(root, &p, out);
            } else if ft.is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                out.push(format!(
                    "l {}:{} {rel} -> {}",
                    m.uid(),
                    m.gid(),
                    t.display()
                ));
            } else if ft.is_file() {
                let c = std::fs::read(&p).unwrap();
                out.push(format!(
                    "f {perm:o} {}:{} {rel} {:?}",
                    m.uid(),
                    m.gid(),
                    String::from_utf8_lossy(&c)
                ));
            } else if ft.is_char_device() {
                out.push(format!("c rdev={} {rel}", m.rdev()));
            } else if ft.is_fifo() {
                out.push(format!("p {perm:o} {rel}"));
            } else {
                out.push(format!("? {rel}"));
            }
        }
    }
    let mut out = Vec::new();
    rec(root, root, &mut out);
    out
}

fn expected_lower_tree() -> Vec<&'static str> {
    vec![
        "d 755 0:0 bin",
        "l 0:0 bin/rel -> ../etc/keep",
        "l 0:0 bin/sh -> /bin/busybox",
        "f 4755 0:0 bin/su \"#!setuid\\n\"",
        "d 755 0:0 etc",
        "f 600 0:0 etc/gone \"to be deleted\\n\"",
        "f 644 0:0 etc/keep \"keep v1\\n\"",
        "f 644 0:0 etc/keep.hard \"keep v1\\n\"",
        "d 755 0:0 home",
        "d 755 0:0 home/user",
        "f 640 1000:1001 home/user/notes.txt \"notes\\n\"",
        "d 750 0:0 opq",
        "f 644 0:0 opq/old \"old\\n\"",
        "d 755 0:0 run",
        "p 640 run/fifo",
    ]
}

fn expected_upper_tree() -> Vec<&'static str> {
    vec![
        "d 755 0:0 etc",
        "c rdev=0 etc/gone",
        "f 644 0:0 etc/keep \"keep v2\\n\"",
        "d 750 0:0 opq",
        "f 644 0:0 opq/new \"new\\n\"",
    ]
}

fn getxattr(p: &Path, name: &str) -> Option<Vec<u8>> {
    let cp = CString::new(p.as_os_str().as_bytes()).unwrap();
    let cn = CString::new(name).unwrap();
    let mut buf = [0u8; 64];
    // SAFETY: valid NUL-terminated strings and a writable buffer of its length.
    let n = unsafe { libc::getxattr(cp.as_ptr(), cn.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (n >= 0).then(|| buf[..n as usize].to_vec())
}

fn tmp_leftovers(store: &Path) -> Vec<String> {
    match std::fs::read_dir(store) {
        Ok(rd) => rd
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".tmp-"))
            .collect(),
        Err(_) => Vec::new(),
    }
}

fn check_reference_image(img: &ImportedImage, store: &Path) {
    let (lo, up) = (lower(), upper());
    assert_eq!(img.layers, vec![layer_id(&lo), layer_id(&up)]);
    assert_eq!(img.env, vec!["PATH=/usr/bin:/bin", "LANG=C.UTF-8"]);
    assert_eq!(img.working_dir.as_deref(), Some("/work"));
    assert_eq!(img.cmd, vec!["/bin/sh", "-c", "echo hi"]);

    let l0 = store.join(&img.layers[0]);
    let l1 = store.join(&img.layers[1]);
    assert_eq!(tree(&l0), expected_lower_tree());
    assert_eq!(tree(&l1), expected_upper_tree());

    // Hard link shares the inode; mtimes come from the headers.
    let k = std::fs::metadata(l0.join("etc/keep")).unwrap();
    let kh = std::fs::metadata(l0.join("etc/keep.hard")).unwrap();
    assert_eq!(k.ino(), kh.ino());
    assert_eq!(k.mtime(), MTIME as i64);
    assert_eq!(
        std::fs::metadata(l0.join("etc")).unwrap().mtime(),
        MTIME as i64
    );
    assert_eq!(
        std::fs::symlink_metadata(l0.join("bin/sh"))
            .unwrap()
            .mtime(),
        MTIME as i64
    );
    assert_eq!(std::fs::metadata(&l0).unwrap().mode() & 0o7777, 0o755);

    // Whiteout: char device 0:0; opaque dir: trusted.overlay.opaque=y.
    let wh = std::fs::symlink_metadata(l1.join("etc/gone")).unwrap();
    assert!(wh.file_type().is_char_device());
    assert_eq!(wh.rdev(), 0);
    assert_eq!(
        getxattr(&l1.join("opq"), "trusted.overlay.opaque").as_deref(),
        Some(&b"y"[..])
    );
    assert_eq!(getxattr(&l1.join("etc"), "trusted.overlay.opaque"), None);
    assert_eq!(getxattr(&l0.join("opq"), "trusted.overlay.opaque"), None);

    // Metadata files.
    for (id, tar) in [(&img.layers[0], &lo), (&img.layers[1], &up)] {
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(store.join(format!("{id}.json"))).unwrap())
                .unwrap();
        assert_eq!(meta["id"], json!(id));
        assert_eq!(meta["diff_id"], json!(format!("sha256:{}", sha(tar))));
        assert!(meta["source_digest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:"));
    }
    let m0: serde_json::Value = serde_json::from_slice(
        &std::fs::read(store.join(format!("{}.json", img.layers[0]))).unwrap(),
    )
    .unwrap();
    assert_eq!(m0["entries"], json!(13));
    assert_eq!(m0["size"], json!(8 + 14 + 9 + 4 + 6));
    assert!(tmp_leftovers(store).is_empty());
}

fn reference_layers() -> Vec<Layer> {
    vec![plain(lower()), gz(upper())]
}

// ---------------------------------------------------------------------------
// Happy paths
// ---------------------------------------------------------------------------

#[test]
fn oci_layout_two_layers_exact_tree() {
    let t = tempfile::tempdir().unwrap();
    let layers = reference_layers();
    oci_layout(&t.path().join("img"), &layers, Tweaks::default());
    let store = t.path().join("store");
    let img = import(&t.path().join("img"), &store, &ImportLimits::default()).unwrap();
    check_reference_image(&img, &store);
    // The gzip layer's metadata records the compressed blob digest.
    let m1: serde_json::Value = serde_json::from_slice(
        &std::fs::read(store.join(format!("{}.json", img.layers[1]))).unwrap(),
    )
    .unwrap();
    assert_eq!(
        m1["source_digest"],
        json!(format!("sha256:{}", sha(&layers[1].blob)))
    );
    assert_eq!(m1["compression"], json!("gzip"));
}

#[test]
fn docker_save_archive_plain_and_gzip_detected_by_content() {
    let t = tempfile::tempdir().unwrap();
    let archive = docker_archive(
        &reference_layers()
            .into_iter()
            .map(|l| plain(l.tar))
            .collect::<Vec<_>>(),
    );
    // Misleading names: detection is by content.
    let plain_path = t.path().join("image.tar.gz");
    let gz_path = t.path().join("image.tar");
    std::fs::write(&plain_path, &archive).unwrap();
    std::fs::write(&gz_path, gzip(&archive)).unwrap();
    for (src, store) in [(&plain_path, "s1"), (&gz_path, "s2")] {
        let store = t.path().join(store);
        let img = import(src, &store, &ImportLimits::default()).unwrap();
        check_reference_image(&img, &store);
    }
}

#[test]
fn docker_save_with_gzip_layer_and_symlinked_duplicate() {
    // Newer docker save: layers under blobs/sha256, one referenced twice
    // through a symlink; the blob path's digest is verified.
    let t = tempfile::tempdir().unwrap();
    let tar1 = tar_of(&[file("a", b"A", 0o644)]);
    let layer = gz(tar1.clone());
    let cfg = serde_json::to_vec(&json!({
        "config": {"Cmd": ["/a"]},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{}", sha(&tar1)), format!("sha256:{}", sha(&tar1))]}
    }))
    .unwrap();
    let mut b = tar::Builder::new(Vec::new());
    let lpath = format!("blobs/sha256/{}", sha(&layer.blob));
    let cpath = format!("blobs/sha256/{}", sha(&cfg));
    for (p, d) in [(&lpath, &layer.blob), (&cpath, &cfg)] {
        let mut h = tar::Header::new_gnu();
        h.set_size(d.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, p, d.as_slice()).unwrap();
    }
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(EntryType::Symlink);
    h.set_size(0);
    b.append_link(&mut h, "dup/layer.tar", format!("../{lpath}"))
        .unwrap();
    let manifest = json!([{"Config": cpath, "Layers": [lpath, "dup/layer.tar"]}]);
    let m = serde_json::to_vec(&manifest).unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_size(m.len() as u64);
    h.set_mode(0o644);
    b.append_data(&mut h, "manifest.json", m.as_slice())
        .unwrap();
    let src = t.path().join("img");
    std::fs::write(&src, b.into_inner().unwrap()).unwrap();
    let store = t.path().join("store");
    let img = import(&src, &store, &ImportLimits::default()).unwrap();
    assert_eq!(img.layers, vec![layer_id(&tar1), layer_id(&tar1)]);
    assert_eq!(img.cmd, vec!["/a"]);
    assert_eq!(img.env, Vec::<String>::new());
    assert_eq!(img.working_dir, None);
    assert_eq!(tree(&store.join(&img.layers[0])), vec!["f 644 0:0 a \"A\""]);
}

#[test]
fn oci_layout_packed_as_tar() {
    let t = tempfile::tempdir().unwrap();
    let layout = t.path().join("layout");
    oci_layout(&layout, &reference_layers(), Tweaks::default());
    let mut b = tar::Builder::new(Vec::new());
    b.append_dir_all(".", &layout).unwrap();
    let src = t.path().join("oci.tar");
    std::fs::write(&src, gzip(&b.into_inner().unwrap())).unwrap();
    let store = t.path().join("store");
    let img = import(&src, &store, &ImportLimits::default()).unwrap();
    check_reference_image(&img, &store);
}

#[test]
fn nested_index_chooses_linux_amd64() {
    let t = tempfile::tempdir().unwrap();
    let layout = t.path().join("img");
    let mdigest = oci_layout(&layout, &reference_layers(), Tweaks::default());
    let msize = std::fs::metadata(layout.join("blobs/sha256").join(&mdigest[7..]))
        .unwrap()
        .len();
    let missing = format!("sha256:{}", "0".repeat(64));
    let nested = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": missing, "size": 10,
             "platform": {"os": "linux", "architecture": "arm64"}},
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": mdigest, "size": msize,
             "platform": {"os": "linux", "architecture": "amd64"}},
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": missing, "size": 10,
             "platform": {"os": "unknown", "architecture": "unknown"}}
        ]
    }))
    .unwrap();
    let ndigest = write_blob(&layout, &nested);
    let index = json!({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.index.v1+json", "digest": ndigest, "size": nested.len()}
    ]});
    std::fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .unwrap();
    let store = t.path().join("store");
    let img = import(&layout, &store, &ImportLimits::default()).unwrap();
    check_reference_image(&img, &store);
}

#[test]
fn ambiguous_index_is_an_error() {
    let t = tempfile::tempdir().unwrap();
    let layout = t.path().join("img");
    let mdigest = oci_layout(&layout, &reference_layers(), Tweaks::default());
    let index = json!({"schemaVersion": 2, "manifests": [
        {"digest": mdigest, "platform": {"os": "linux", "architecture": "arm64"}},
        {"digest": mdigest, "platform": {"os": "linux", "architecture": "s390x"}}
    ]});
    std::fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .unwrap();
    let err = import(&layout, &t.path().join("store"), &ImportLimits::default()).unwrap_err();
    assert!(
        matches!(err, OciError::InvalidImage { ref blob, .. } if blob == "index.json"),
        "{err}"
    );
}

#[test]
fn second_import_uses_the_cache() {
    let t = tempfile::tempdir().unwrap();
    let layout = t.path().join("img");
    let layers = reference_layers();
    oci_layout(&layout, &layers, Tweaks::default());
    let store = t.path().join("store");
    let first = import(&layout, &store, &ImportLimits::default()).unwrap();
    let inode = std::fs::metadata(store.join(&first.layers[0]))
        .unwrap()
        .ino();
    // Remove the layer blobs: a cached import must not need them.
    for l in &layers {
        std::fs::remove_file(layout.join("blobs/sha256").join(sha(&l.blob))).unwrap();
    }
    let second = import(&layout, &store, &ImportLimits::default()).unwrap();
    assert_eq!(first, second);
    assert_eq!(
        std::fs::metadata(store.join(&first.layers[0]))
            .unwrap()
            .ino(),
        inode
    );
    check_reference_image(&second, &store);
    // Without the cache the missing blob is an error naming it.
    let err = import(&layout, &t.path().join("fresh"), &ImportLimits::default()).unwrap_err();
    let want = format!("sha256:{}", sha(&layers[0].blob));
    assert!(
        matches!(err, OciError::MissingBlob { ref blob } if *blob == want),
        "{err}"
    );
    assert!(tmp_leftovers(&t.path().join("fresh")).is_empty());
}

#[test]
fn concurrent_imports_of_the_same_image() {
    let t = tempfile::tempdir().unwrap();
    let layout = t.path().join("img");
    oci_layout(&layout, &reference_layers(), Tweaks::default());
    let store = t.path().join("store");
    let results: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| s.spawn(|| import(&layout, &store, &ImportLimits::default())))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in &results {
        assert_eq!(r.as_ref().unwrap(), results[0].as_ref().unwrap());
    }
    check_reference_image(results[0].as_ref().unwrap(), &store);
    let mut names: Vec<_> = std::fs::read_dir(&store)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), 4, "{names:?}");
}

/// Unmounts on drop, so a failing assertion cannot leak the mount.
struct Mounted(PathBuf);
impl Drop for Mounted {
    fn drop(&mut self) {
        let c = CString::new(self.0.as_os_str().as_bytes()).unwrap();
        // SAFETY: NUL-terminated path; MNT_DETACH always succeeds on a mount point.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

#[test]
fn overlay_of_imported_layers_hides_deleted_files() {
    let t = tempfile::tempdir().unwrap();
    oci_layout(
        &t.path().join("img"),
        &reference_layers(),
        Tweaks::default(),
    );
    let store = t.path().join("store");
    let img = import(&t.path().join("img"), &store, &ImportLimits::default()).unwrap();
    let merged = t.path().join("merged");
    std::fs::create_dir(&merged).unwrap();
    // Top layer first in lowerdir.
    let opts = format!(
        "lowerdir={}:{}",
        store.join(&img.layers[1]).display(),
        store.join(&img.layers[0]).display()
    );
    let (src, fstype) = (
        CString::new("overlay").unwrap(),
        CString::new("overlay").unwrap(),
    );
    let target = CString::new(merged.as_os_str().as_bytes()).unwrap();
    let data = CString::new(opts).unwrap();
    // SAFETY: all pointers are NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_RDONLY,
            data.as_ptr().cast(),
        )
    };
    assert_eq!(
        rc,
        0,
        "overlay mount failed: {}",
        std::io::Error::last_os_error()
    );
    let _guard = Mounted(merged.clone());
    assert!(
        !merged.join("etc/gone").exists(),
        "whiteout must hide etc/gone"
    );
    assert!(
        !merged.join("opq/old").exists(),
        "opaque dir must hide opq/old"
    );
    assert_eq!(std::fs::read(merged.join("opq/new")).unwrap(), b"new\n");
    assert_eq!(
        std::fs::read(merged.join("etc/keep")).unwrap(),
        b"keep v2\n"
    );
    assert_eq!(
        std::fs::read(merged.join("etc/keep.hard")).unwrap(),
        b"keep v1\n"
    );
    assert_eq!(
        std::fs::read(merged.join("home/user/notes.txt")).unwrap(),
        b"notes\n"
    );
    let mut etc: Vec<_> = std::fs::read_dir(merged.join("etc"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    etc.sort();
    assert_eq!(etc, vec!["keep", "keep.hard"]);
    let opq: Vec<_> = std::fs::read_dir(merged.join("opq"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(opq, vec!["new"]);
}

#[test]
fn absolute_paths_land_inside_the_layer() {
    let t = tempfile::tempdir().unwrap();
    let marker = b"root:x:0:0:pwned:/root:/bin/sh\n";
    let tar = tar_of(&[
        file("/etc/passwd", marker, 0o644),
        file("/./a//b/../c", b"c", 0o644),
    ]);
    let (store, res) = import_one(t.path(), vec![plain(tar.clone())], ImportLimits::default());
    let img = res.unwrap();
    let l = store.join(&img.layers[0]);
    assert_eq!(std::fs::read(l.join("etc/passwd")).unwrap(), marker);
    assert_eq!(std::fs::read(l.join("a/c")).unwrap(), b"c");
    let host = std::fs::read("/etc/passwd").unwrap_or_default();
    assert!(!host.windows(marker.len()).any(|w| w == marker));
}

#[test]
fn dotdot_through_a_symlink_is_resolved_lexically_inside_the_layer() {
    let t = tempfile::tempdir().unwrap();
    let canary = t.path().join("canary");
    std::fs::create_dir(&canary).unwrap();
    let tar = tar_of(&[
        dir("d/", 0o755),
        sym("link", canary.to_str().unwrap()),
        file("link/../x", b"x", 0o644),
    ]);
    let (store, res) = import_one(t.path(), vec![plain(tar)], ImportLimits::default());
    let l = store.join(&res.unwrap().layers[0]);
    assert_eq!(std::fs::read(l.join("x")).unwrap(), b"x");
    assert_eq!(std::fs::read_dir(&canary).unwrap().count(), 0);
    assert!(!t.path().join("x").exists());
}

// ---------------------------------------------------------------------------
// Hostile input
// ---------------------------------------------------------------------------

/// Imports a one-image OCI layout made of `layers` into `<dir>/store`.
fn import_one(
    dir: &Path,
    layers: Vec<Layer>,
    limits: ImportLimits,
) -> (PathBuf, Result<ImportedImage, OciError>) {
    import_tweaked(dir, layers, Tweaks::default(), limits)
}

fn import_tweaked(
    dir: &Path,
    layers: Vec<Layer>,
    tw: Tweaks,
    limits: ImportLimits,
) -> (PathBuf, Result<ImportedImage, OciError>) {
    let layout = dir.join("img");
    oci_layout(&layout, &layers, tw);
    let store = dir.join("store");
    let res = import(&layout, &store, &limits);
    (store, res)
}

/// The store holds no temp dir and no finished layer.
fn assert_store_clean(store: &Path) {
    assert!(tmp_leftovers(store).is_empty(), "temp dir left behind");
    let layers: Vec<_> = std::fs::read_dir(store)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("sha256-"))
        .collect();
    assert!(layers.is_empty(), "unexpected layers {layers:?}");
}

fn expect_unsafe(t: &Path, tar: Vec<u8>, entry_want: &str, reason_has: &str) -> PathBuf {
    let (store, res) = import_one(t, vec![plain(tar)], ImportLimits::default());
    match res {
        Err(OciError::UnsafeEntry {
            entry,
            reason,
            blob,
        }) => {
            assert_eq!(entry, entry_want);
            assert!(reason.contains(reason_has), "reason {reason:?}");
            assert!(blob.starts_with("sha256:"));
        }
        other => panic!("expected UnsafeEntry, got {other:?}"),
    }
    assert_store_clean(&store);
    store
}

#[test]
fn dotdot_escape_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let tar = tar_of(&[
        file("ok", b"1", 0o644),
        file("../../escape", b"pwned", 0o644),
    ]);
    let store = expect_unsafe(t.path(), tar, "../../escape", "climbs above the layer root");
    assert!(!t.path().join("escape").exists());
    assert!(!store.join("escape").exists());
    let tar = tar_of(&[file("a/b/../../../escape", b"pwned", 0o644)]);
    let t2 = tempfile::tempdir().unwrap();
    expect_unsafe(t2.path(), tar, "a/b/../../../escape", "climbs above");
    assert!(!t2.path().join("escape").exists());
}

#[test]
fn writing_through_a_symlink_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let canary = t.path().join("canary");
    std::fs::create_dir(&canary).unwrap();
    let tar = tar_of(&[
        sym("a", canary.to_str().unwrap()),
        file("a/pwned", b"pwned", 0o644),
    ]);
    expect_unsafe(t.path(), tar, "a/pwned", "symlink");
    assert!(!canary.join("pwned").exists());

    // Deeper: a symlink to / then a nested path; and a directory entry.
    let t2 = tempfile::tempdir().unwrap();
    let canary2 = t2.path().join("canary2");
    let tar = tar_of(&[
        sym("r", "/"),
        dir(&format!("r{}", canary2.display()), 0o755),
    ]);
    expect_unsafe(
        t2.path(),
        tar,
        &format!("r{}", canary2.display()),
        "symlink",
    );
    assert!(!canary2.exists());

    // A hard link whose parent is a symlink.
    let t3 = tempfile::tempdir().unwrap();
    let canary3 = t3.path().join("canary3");
    std::fs::create_dir(&canary3).unwrap();
    let tar = tar_of(&[
        file("f", b"f", 0o644),
        sym("s", canary3.to_str().unwrap()),
        hard("s/h", "f"),
    ]);
    expect_unsafe(t3.path(), tar, "s/h", "symlink");
    assert_eq!(std::fs::read_dir(&canary3).unwrap().count(), 0);
}

#[test]
fn replacing_a_symlink_does_not_write_through_it() {
    // A later regular file with the symlink's own name replaces the link.
    let t = tempfile::tempdir().unwrap();
    let canary = t.path().join("canary");
    std::fs::write(&canary, b"original").unwrap();
    let tar = tar_of(&[sym("a", canary.to_str().unwrap()), file("a", b"new", 0o644)]);
    let (store, res) = import_one(t.path(), vec![plain(tar)], ImportLimits::default());
    let l = store.join(&res.unwrap().layers[0]);
    assert_eq!(std::fs::read(&canary).unwrap(), b"original");
    assert_eq!(tree(&l), vec!["f 644 0:0 a \"new\""]);
}

#[test]
fn hard_links_outside_the_layer_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let tar = tar_of(&[hard("shadow", "/etc/shadow")]);
    expect_unsafe(t.path(), tar, "shadow", "not an entry extracted earlier");
    let t2 = tempfile::tempdir().unwrap();
    let tar = tar_of(&[hard("shadow", "../../../../etc/shadow")]);
    expect_unsafe(t2.path(), tar, "shadow", "escapes the layer");
    // Even to a path that exists in the temp dir but was not a file entry.
    let t3 = tempfile::tempdir().unwrap();
    let tar = tar_of(&[dir("d/", 0o755), hard("h", "d")]);
    expect_unsafe(t3.path(), tar, "h", "not an entry extracted earlier");
}

#[test]
fn device_nodes_are_refused() {
    let t = tempfile::tempdir().unwrap();
    expect_unsafe(
        t.path(),
        tar_of(&[chr("dev/mem", 1, 1)]),
        "dev/mem",
        "device nodes",
    );
    let t2 = tempfile::tempdir().unwrap();
    expect_unsafe(
        t2.path(),
        tar_of(&[blk("dev/sda")]),
        "dev/sda",
        "device nodes",
    );
}

#[test]
fn overlay_format_whiteout_char_device_is_accepted() {
    let t = tempfile::tempdir().unwrap();
    let (store, res) = import_one(
        t.path(),
        vec![plain(tar_of(&[chr("gone", 0, 0)]))],
        ImportLimits::default(),
    );
    let l = store.join(&res.unwrap().layers[0]);
    assert_eq!(tree(&l), vec!["c rdev=0 gone"]);
}

#[test]
fn limits_are_enforced() {
    let big = tar_of(&[
        file("small", b"0123456789", 0o644),
        file("big", &[7u8; 11], 0o644),
    ]);
    let t = tempfile::tempdir().unwrap();
    let limits = ImportLimits {
        max_file_bytes: 10,
        ..ImportLimits::default()
    };
    let (store, res) = import_one(t.path(), vec![plain(big.clone())], limits);
    assert!(
        matches!(res, Err(OciError::LimitExceeded { ref entry, .. }) if entry == "big"),
        "{res:?}"
    );
    assert_store_clean(&store);

    let t = tempfile::tempdir().unwrap();
    let limits = ImportLimits {
        max_total_bytes: 15,
        ..ImportLimits::default()
    };
    let (store, res) = import_one(t.path(), vec![plain(big.clone())], limits);
    assert!(
        matches!(res, Err(OciError::LimitExceeded { ref entry, .. }) if entry == "big"),
        "{res:?}"
    );
    assert_store_clean(&store);

    let t = tempfile::tempdir().unwrap();
    let limits = ImportLimits {
        max_entries: 1,
        ..ImportLimits::default()
    };
    let (store, res) = import_one(t.path(), vec![plain(big.clone())], limits);
    assert!(
        matches!(res, Err(OciError::LimitExceeded { ref entry, .. }) if entry == "big"),
        "{res:?}"
    );
    assert_store_clean(&store);

    // Total over two layers: the second one fails, the first stays cached.
    let t = tempfile::tempdir().unwrap();
    let l2 = tar_of(&[file("more", &[1u8; 10], 0o644)]);
    let limits = ImportLimits {
        max_total_bytes: 25,
        ..ImportLimits::default()
    };
    let (store, res) = import_one(t.path(), vec![plain(big.clone()), plain(l2)], limits);
    assert!(
        matches!(res, Err(OciError::LimitExceeded { ref entry, .. }) if entry == "more"),
        "{res:?}"
    );
    assert!(tmp_leftovers(&store).is_empty());

    // A gzip bomb of zero padding is cut off by the stream cap.
    let t = tempfile::tempdir().unwrap();
    let mut bomb = tar_of(&[file("f", b"f", 0o644)]);
    bomb.extend(std::iter::repeat_n(0u8, 4 << 20));
    let limits = ImportLimits {
        max_total_bytes: 10,
        max_entries: 10,
        ..ImportLimits::default()
    };
    let (store, res) = import_one(t.path(), vec![gz(bomb)], limits);
    assert!(
        matches!(res, Err(OciError::LimitExceeded { .. })),
        "{res:?}"
    );
    assert_store_clean(&store);
}

#[test]
fn truncated_gzip_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let mut layer = gz(tar_of(&[
        file("f", &[42u8; 100_000], 0o644),
        file("g", b"g", 0o644),
    ]));
    layer.blob.truncate(layer.blob.len() / 2);
    let blob = format!("sha256:{}", sha(&layer.blob));
    let (store, res) = import_one(t.path(), vec![layer], ImportLimits::default());
    assert!(
        matches!(res, Err(OciError::CorruptLayer { blob: ref b, .. }) if *b == blob),
        "{res:?}"
    );
    assert_store_clean(&store);

    // Garbage that is neither gzip nor tar.
    let t = tempfile::tempdir().unwrap();
    let garbage = plain(b"this is not a tar archive at all, just some text ".repeat(20));
    let (store, res) = import_one(t.path(), vec![garbage], ImportLimits::default());
    assert!(matches!(res, Err(OciError::CorruptLayer { .. })), "{res:?}");
    assert_store_clean(&store);
}

#[test]
fn digest_mismatches_are_refused() {
    // Blob content does not match its descriptor digest.
    let t = tempfile::tempdir().unwrap();
    let wrong = format!("sha256:{}", "ab".repeat(32));
    let tw = Tweaks {
        layer_digest: Some((0, wrong.clone())),
        ..Tweaks::default()
    };
    let (store, res) = import_tweaked(
        t.path(),
        vec![gz(tar_of(&[file("f", b"f", 0o644)]))],
        tw,
        ImportLimits::default(),
    );
    assert!(
        matches!(res, Err(OciError::DigestMismatch { ref blob, .. }) if *blob == wrong),
        "{res:?}"
    );
    assert_store_clean(&store);

    // Diff id in the config does not match the uncompressed content.
    let t = tempfile::tempdir().unwrap();
    let layer = gz(tar_of(&[file("f", b"f", 0o644)]));
    let blob = format!("sha256:{}", sha(&layer.blob));
    let tw = Tweaks {
        diff_ids: Some(vec![format!("sha256:{}", "cd".repeat(32))]),
        ..Tweaks::default()
    };
    let (store, res) = import_tweaked(t.path(), vec![layer], tw, ImportLimits::default());
    assert!(
        matches!(res, Err(OciError::DiffIdMismatch { blob: ref b, .. }) if *b == blob),
        "{res:?}"
    );
    assert_store_clean(&store);

    // A hostile diff id cannot become a path.
    let t = tempfile::tempdir().unwrap();
    let tw = Tweaks {
        diff_ids: Some(vec!["sha256:../../../tmp/x".into()]),
        ..Tweaks::default()
    };
    let (store, res) = import_tweaked(
        t.path(),
        vec![plain(tar_of(&[file("f", b"f", 0o644)]))],
        tw,
        ImportLimits::default(),
    );
    assert!(matches!(res, Err(OciError::InvalidImage { .. })), "{res:?}");
    assert_store_clean(&store);

    // Tampered docker archive layer: diff id check catches it.
    let t = tempfile::tempdir().unwrap();
    let good = tar_of(&[file("f", b"good", 0o644)]);
    let mut archive = docker_archive(&[plain(good)]);
    let pos = archive.windows(4).position(|w| w == b"good").unwrap();
    archive[pos..pos + 4].copy_from_slice(b"evil");
    let src = t.path().join("img.tar");
    std::fs::write(&src, archive).unwrap();
    let store = t.path().join("store");
    let res = import(&src, &store, &ImportLimits::default());
    assert!(
        matches!(res, Err(OciError::DiffIdMismatch { ref blob, .. }) if blob.ends_with("/layer.tar")),
        "{res:?}"
    );
    assert_store_clean(&store);
}

#[test]
fn missing_blob_is_an_error() {
    let t = tempfile::tempdir().unwrap();
    let layer = gz(tar_of(&[file("f", b"f", 0o644)]));
    let blob = format!("sha256:{}", sha(&layer.blob));
    let tw = Tweaks {
        skip_layer_blobs: true,
        ..Tweaks::default()
    };
    let (store, res) = import_tweaked(t.path(), vec![layer], tw, ImportLimits::default());
    assert!(
        matches!(res, Err(OciError::MissingBlob { blob: ref b }) if *b == blob),
        "{res:?}"
    );
    assert_store_clean(&store);
}

#[test]
fn zstd_layers_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let mut fake = vec![0x28, 0xb5, 0x2f, 0xfd];
    fake.extend_from_slice(&[0u8; 64]);
    let layer = Layer {
        tar: fake.clone(),
        blob: fake,
        media_type: "application/octet-stream".into(),
    };
    let (store, res) = import_one(t.path(), vec![layer], ImportLimits::default());
    assert!(
        matches!(res, Err(OciError::UnsupportedCompression { .. })),
        "{res:?}"
    );
    assert_store_clean(&store);

    let t = tempfile::tempdir().unwrap();
    let mut layer = plain(tar_of(&[file("f", b"f", 0o644)]));
    layer.media_type = "application/vnd.oci.image.layer.v1.tar+zstd".into();
    let (store, res) = import_one(t.path(), vec![layer], ImportLimits::default());
    assert!(
        matches!(res, Err(OciError::UnsupportedCompression { .. })),
        "{res:?}"
    );
    assert_store_clean(&store);
}

#[test]
fn unrecognised_sources_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let f = t.path().join("junk");
    std::fs::write(&f, b"hello world").unwrap();
    let res = import(&f, &t.path().join("store"), &ImportLimits::default());
    assert!(
        matches!(res, Err(OciError::UnrecognizedSource { .. })),
        "{res:?}"
    );
    let empty = t.path().join("emptydir");
    std::fs::create_dir(&empty).unwrap();
    let res = import(&empty, &t.path().join("store"), &ImportLimits::default());
    assert!(
        matches!(res, Err(OciError::UnrecognizedSource { .. })),
        "{res:?}"
    );
    assert!(tmp_leftovers(&t.path().join("store")).is_empty());
}

#[test]
fn failed_import_leaves_store_reusable() {
    let t = tempfile::tempdir().unwrap();
    let bad = tar_of(&[file("a", b"a", 0o644), file("../../x", b"x", 0o644)]);
    let (store, res) = import_one(t.path(), vec![plain(bad)], ImportLimits::default());
    assert!(res.is_err());
    let layout = t.path().join("good");
    oci_layout(&layout, &reference_layers(), Tweaks::default());
    let img = import(&layout, &store, &ImportLimits::default()).unwrap();
    check_reference_image(&img, &store);
}

#[test]
fn error_messages_name_the_culprit_and_the_reason() {
    let t = tempfile::tempdir().unwrap();
    let tar = tar_of(&[file("../../escape", b"x", 0o644)]);
    let layer = plain(tar);
    let blob = format!("sha256:{}", sha(&layer.blob));
    let (_, res) = import_one(t.path(), vec![layer], ImportLimits::default());
    let msg = res.unwrap_err().to_string();
    assert_eq!(
        msg,
        format!("layer {blob}: entry \"../../escape\" refused: `..` climbs above the layer root")
    );

    let t = tempfile::tempdir().unwrap();
    let canary = t.path().join("c");
    let tar = tar_of(&[
        sym("a", canary.to_str().unwrap()),
        file("a/pwned", b"x", 0o644),
    ]);
    let (_, res) = import_one(t.path(), vec![plain(tar)], ImportLimits::default());
    let msg = res.unwrap_err().to_string();
    assert!(
        msg.ends_with(
            "entry \"a/pwned\" refused: parent \"a\" is a symlink (refusing to write through it)"
        ),
        "{msg}"
    );

    let t = tempfile::tempdir().unwrap();
    let wrong = format!("sha256:{}", "ab".repeat(32));
    let tw = Tweaks {
        layer_digest: Some((0, wrong.clone())),
        ..Tweaks::default()
    };
    let layer = plain(tar_of(&[file("f", b"f", 0o644)]));
    let actual = format!("sha256:{}", sha(&layer.blob));
    let (_, res) = import_tweaked(t.path(), vec![layer], tw, ImportLimits::default());
    assert_eq!(
        res.unwrap_err().to_string(),
        format!("blob {wrong}: digest mismatch: expected {wrong}, got {actual}")
    );

    let t = tempfile::tempdir().unwrap();
    let limits = ImportLimits {
        max_file_bytes: 3,
        ..ImportLimits::default()
    };
    let (_, res) = import_one(
        t.path(),
        vec![plain(tar_of(&[file("big", b"1234", 0o644)]))],
        limits,
    );
    let msg = res.unwrap_err().to_string();
    assert!(
        msg.ends_with("entry \"big\": limit exceeded: file of 4 bytes exceeds max_file_bytes 3"),
        "{msg}"
    );
}

#[test]
#[ignore = "timing probe, run by hand"]
fn probe_many_entries() {
    let mut ents = Vec::new();
    for i in 0..200 {
        ents.push(dir(&format!("usr/share/d{i}/"), 0o755));
        for j in 0..100 {
            ents.push(file(&format!("usr/share/d{i}/sub/f{j}"), b"data", 0o644));
        }
    }
    let t = tempfile::tempdir().unwrap();
    let layout = t.path().join("img");
    oci_layout(&layout, &[gz(tar_of(&ents))], Tweaks::default());
    let start = std::time::Instant::now();
    import(&layout, &t.path().join("store"), &ImportLimits::default()).unwrap();
    eprintln!("20k entries: {:?}", start.elapsed());
}

#[test]
fn replaced_parent_directory_is_not_used_stale() {
    // `a/b` is opened (opaque marker), then replaced by a symlink out of the
    // layer: the next write below `a/b` must see the symlink and be refused.
    let t = tempfile::tempdir().unwrap();
    let canary = t.path().join("canary");
    std::fs::create_dir(&canary).unwrap();
    let tar = tar_of(&[
        dir("a/b/", 0o755),
        file("a/b/.wh..wh..opq", b"", 0o644),
        sym("a/b", canary.to_str().unwrap()),
        file("a/b/pwned", b"x", 0o644),
    ]);
    expect_unsafe(t.path(), tar, "a/b/pwned", "symlink");
    assert_eq!(std::fs::read_dir(&canary).unwrap().count(), 0);
}

#[test]
fn later_entries_replace_earlier_ones_in_a_layer() {
    let t = tempfile::tempdir().unwrap();
    let tar = tar_of(&[
        dir("x/", 0o755),
        file("x", b"file now", 0o600),
        file("y", b"file first", 0o644),
        dir("y/", 0o700),
        file("y/inner", b"i", 0o644),
        file("z", b"v1", 0o644),
        file("z", b"v2", 0o640),
        file("gone", b"g", 0o644),
        file(".wh.gone", b"", 0o644),
    ]);
    let (store, res) = import_one(t.path(), vec![plain(tar)], ImportLimits::default());
    let l = store.join(&res.unwrap().layers[0]);
    assert_eq!(
        tree(&l),
        vec![
            "c rdev=0 gone",
            "f 600 0:0 x \"file now\"",
            "d 700 0:0 y",
            "f 644 0:0 y/inner \"i\"",
            "f 640 0:0 z \"v2\"",
        ]
    );
}

#[test]
fn symlinked_or_fifo_blobs_in_a_layout_dir_read_as_missing() {
    let t = tempfile::tempdir().unwrap();
    let layer = plain(tar_of(&[file("f", b"f", 0o644)]));
    let layout = t.path().join("img");
    oci_layout(&layout, std::slice::from_ref(&layer), Tweaks::default());
    let blob = layout.join("blobs/sha256").join(sha(&layer.blob));
    let elsewhere = t.path().join("elsewhere");
    std::fs::rename(&blob, &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &blob).unwrap();
    let store = t.path().join("store");
    let res = import(&layout, &store, &ImportLimits::default());
    assert!(matches!(res, Err(OciError::MissingBlob { .. })), "{res:?}");
    std::fs::remove_file(&blob).unwrap();
    let c = CString::new(blob.as_os_str().as_bytes()).unwrap();
    // SAFETY: NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let res = import(&layout, &store, &ImportLimits::default());
    assert!(matches!(res, Err(OciError::MissingBlob { .. })), "{res:?}");
    assert_store_clean(&store);
}

#[test]
fn deep_and_long_paths_are_bounded() {
    // Implicit parent directories count towards max_entries.
    let t = tempfile::tempdir().unwrap();
    let limits = ImportLimits {
        max_entries: 4,
        ..ImportLimits::default()
    };
    let tar = tar_of(&[file("a/b/c/d/e/f", b"x", 0o644)]);
    let (store, res) = import_one(t.path(), vec![plain(tar)], limits);
    assert!(
        matches!(res, Err(OciError::LimitExceeded { ref entry, .. }) if entry == "a/b/c/d/e/f"),
        "{res:?}"
    );
    assert_store_clean(&store);

    // A GNU long name beyond PATH_MAX is refused.
    let t = tempfile::tempdir().unwrap();
    let long = "d/".repeat(2100) + "f";
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(1);
    h.set_mode(0o644);
    b.append_data(&mut h, &long, &b"x"[..]).unwrap();
    let (store, res) = import_one(
        t.path(),
        vec![plain(b.into_inner().unwrap())],
        ImportLimits::default(),
    );
    assert!(
        matches!(res, Err(OciError::UnsafeEntry { ref reason, .. }) if reason.contains("longer than 4096")),
        "{res:?}"
    );
    assert_store_clean(&store);

    // A long but legal name (GNU long-name extension) works.
    let t = tempfile::tempdir().unwrap();
    let name = format!("{}/file", "n".repeat(200));
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(2);
    h.set_mode(0o600);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(MTIME);
    b.append_data(&mut h, &name, &b"ok"[..]).unwrap();
    let (store, res) = import_one(
        t.path(),
        vec![plain(b.into_inner().unwrap())],
        ImportLimits::default(),
    );
    let l = store.join(&res.unwrap().layers[0]);
    assert_eq!(std::fs::read(l.join(&name)).unwrap(), b"ok");
}
