//! TEMPORARY interface stub; replaced by the seccomp module from its branch.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("seccomp: {0}")]
    Other(String),
}
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct CompiledSeccomp {
    pub programs: Vec<Vec<(u16, u8, u8, u32)>>,
}
pub struct PreparedSeccomp;
impl CompiledSeccomp {
    pub fn prepare(&self) -> PreparedSeccomp {
        PreparedSeccomp
    }
}
impl PreparedSeccomp {
    pub fn apply(&self) -> Result<(), SeccompError> {
        Ok(())
    }
}
pub struct SeccompPolicy;
impl SeccompPolicy {
    pub fn embedded() -> Result<Self, SeccompError> {
        Ok(Self)
    }
    pub fn compile(&self) -> Result<CompiledSeccomp, SeccompError> {
        Ok(CompiledSeccomp { programs: vec![] })
    }
}
