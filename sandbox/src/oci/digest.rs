//! Content digests: the validated `sha256:<hex>` that names blobs and layers.

use sha2::{Digest as _, Sha256};

use super::OciError;

/// A validated `sha256:<64 lowercase hex>` digest; only the hex is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Sha256Digest(String);

impl Sha256Digest {
    pub(super) fn parse(s: &str, blob: &str) -> Result<Self, OciError> {
        let hex = s
            .strip_prefix("sha256:")
            .ok_or_else(|| OciError::InvalidImage {
                blob: blob.to_string(),
                reason: format!("unsupported digest {s:?} (only sha256 is supported)"),
            })?;
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(OciError::InvalidImage {
                blob: blob.to_string(),
                reason: format!("malformed sha256 digest {s:?}"),
            });
        }
        Ok(Self(hex.to_string()))
    }
    pub(super) fn from_hasher(h: Sha256) -> Self {
        Self(hex::encode(h.finalize()))
    }
    /// The digest of `data`.
    pub(super) fn of(data: &[u8]) -> Self {
        Self(hex::encode(Sha256::digest(data)))
    }
    pub(super) fn display(&self) -> String {
        format!("sha256:{}", self.0)
    }
    pub(super) fn layer_id(&self) -> String {
        format!("sha256-{}", self.0)
    }
    pub(super) fn blob_path(&self) -> String {
        format!("blobs/sha256/{}", self.0)
    }
}
