//! TEMPORARY interface stub; replaced by the landlock module from its branch.
#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    #[error("landlock: {0}")]
    Other(String),
}
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct LandlockPolicy {}
pub struct PreparedLandlock;
impl LandlockPolicy {
    pub fn embedded() -> Result<Self, LandlockError> {
        Ok(Self {})
    }
    pub fn prepare(&self, _root: &std::path::Path) -> Result<PreparedLandlock, LandlockError> {
        Ok(PreparedLandlock)
    }
}
impl PreparedLandlock {
    pub fn enforce(self) -> Result<(), LandlockError> {
        Ok(())
    }
}
