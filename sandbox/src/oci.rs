//! TEMPORARY interface stub; replaced by the oci module from its branch.
use std::path::Path;
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("oci: {0}")]
    Other(String),
}
pub struct ImportLimits {
    pub max_total_bytes: u64,
    pub max_file_bytes: u64,
    pub max_entries: u64,
}
impl Default for ImportLimits {
    fn default() -> Self {
        Self { max_total_bytes: 8 << 30, max_file_bytes: 4 << 30, max_entries: 1_000_000 }
    }
}
pub struct ImportedImage {
    pub layers: Vec<String>,
    pub env: Vec<String>,
    pub working_dir: Option<String>,
    pub cmd: Vec<String>,
}
pub fn import(_source: &Path, _store: &Path, _limits: &ImportLimits) -> Result<ImportedImage, OciError> {
    Err(OciError::Other("not merged yet".into()))
}
