//! `engine fingerprint`: an environment's feature vector, or a shipped reference one.

pub fn run(rootfs: &str, shipped: Option<String>, json: bool) -> anyhow::Result<i32> {
    let fp = match shipped {
        Some(name) => engine::fingerprint::shipped_fingerprint(&name)?,
        None => {
            let spec: sandbox::RootfsSpec = rootfs.parse()?;
            let rt = super::sandbox::runtime()?;
            engine::fingerprint::fingerprint_rootfs(&rt, &spec)?
        }
    };
    if json {
        outln!("{}", serde_json::to_string_pretty(&fp)?);
    } else {
        out!("{}", fp.text());
    }
    Ok(0)
}
