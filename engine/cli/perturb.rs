//! `engine perturb list`.

use clap::Subcommand;

#[derive(Subcommand)]
pub enum PerturbCmd {
    /// List every perturbation with its parameters, defaults and realistic ranges.
    List {
        /// A Markdown table (as in docs/environments.md).
        #[arg(long)]
        markdown: bool,
    },
}

pub fn run(cmd: PerturbCmd) -> anyhow::Result<i32> {
    match cmd {
        PerturbCmd::List { markdown } => {
            if markdown {
                out!("{}", engine::perturb::catalogue_markdown());
            } else {
                out!("{}", engine::perturb::catalogue_text());
            }
            Ok(0)
        }
    }
}
