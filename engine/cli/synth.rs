//! `engine synth TEMPLATE`: synthesize instances of a template and print them.

use std::path::Path;

pub fn run(template: &Path, seed: u64, count: u64, json: bool) -> anyhow::Result<i32> {
    let t = engine::template::Template::load(template)?;
    let rt = super::sandbox::runtime()?;
    let items =
        engine::template::synthesize(&rt, &super::episode::cache()?, &t, seed, count.max(1))?;
    if json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&engine::template::synth_report(&t, &items))?
        );
    } else {
        out!("{}", engine::template::synth_text(&t, &items));
    }
    Ok(0)
}
