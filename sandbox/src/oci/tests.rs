//! Unit tests of the importer's pure parts (the end-to-end ones are in
//! `sandbox/tests/it/oci.rs`).

use super::digest::Sha256Digest;
use super::layer::stream_cap;
use super::manifest::{choose_manifest, digest_from_blob_path, Descriptor, Platform};
use super::paths::{join, normalize};
use super::{ImportLimits, OciError};

fn norm(s: &str) -> Result<String, String> {
    normalize(s.as_bytes()).map(|c| join(&c))
}

#[test]
fn normalize_is_lexical_and_rooted() {
    assert_eq!(norm("/etc/passwd").unwrap(), "etc/passwd");
    assert_eq!(norm("./a//b/./c/").unwrap(), "a/b/c");
    assert_eq!(norm("a/b/../c").unwrap(), "a/c");
    assert_eq!(norm("link/../x").unwrap(), "x");
    assert_eq!(norm("./").unwrap(), "");
    assert!(norm("../x").unwrap_err().contains("climbs above"));
    assert!(norm("a/../../x").is_err());
    assert!(norm("/..").is_err());
    assert!(normalize(b"a\0b").is_err());
}

#[test]
fn digests_are_strictly_validated() {
    let hex = "ab".repeat(32);
    let d = Sha256Digest::parse(&format!("sha256:{hex}"), "b").unwrap();
    assert_eq!(d.layer_id(), format!("sha256-{hex}"));
    assert_eq!(d.blob_path(), format!("blobs/sha256/{hex}"));
    for bad in [
        format!("sha512:{hex}"),
        format!("sha256:{}", "AB".repeat(32)),
        format!("sha256:{}", &hex[1..]),
        "sha256:../../../../etc/passwd".to_string(),
        format!("sha256:{}/x", &hex[2..]),
    ] {
        assert!(
            matches!(
                Sha256Digest::parse(&bad, "b"),
                Err(OciError::InvalidImage { .. })
            ),
            "{bad}"
        );
    }
    assert_eq!(
        digest_from_blob_path(&format!("blobs/sha256/{hex}")),
        Some(d)
    );
    assert_eq!(digest_from_blob_path("abc/layer.tar"), None);
}

fn desc(digest: &str, platform: Option<(&str, &str)>) -> Descriptor {
    Descriptor {
        media_type: None,
        digest: digest.into(),
        size: None,
        platform: platform.map(|(os, arch)| Platform {
            os: os.into(),
            architecture: arch.into(),
        }),
    }
}

#[test]
fn manifest_choice() {
    let one = choose_manifest(vec![desc("a", None)], "i").unwrap();
    assert_eq!(one.digest, "a");
    let with_attestation = choose_manifest(
        vec![
            desc("img", Some(("linux", "arm64"))),
            desc("att", Some(("unknown", "unknown"))),
        ],
        "i",
    )
    .unwrap();
    assert_eq!(with_attestation.digest, "img");
    let multi = choose_manifest(
        vec![
            desc("arm", Some(("linux", "arm64"))),
            desc("amd", Some(("linux", "amd64"))),
            desc("win", Some(("windows", "amd64"))),
        ],
        "i",
    )
    .unwrap();
    assert_eq!(multi.digest, "amd");
    assert!(choose_manifest(vec![], "i").is_err());
    assert!(choose_manifest(vec![desc("a", None), desc("b", None)], "i").is_err());
}

#[test]
fn default_limits() {
    let l = ImportLimits::default();
    assert_eq!(l.max_total_bytes, 8 << 30);
    assert_eq!(l.max_file_bytes, 4 << 30);
    assert_eq!(l.max_entries, 1_000_000);
    assert!(stream_cap(&l, 0) > l.max_total_bytes);
    assert!(stream_cap(&l, u64::MAX) < l.max_total_bytes);
}
