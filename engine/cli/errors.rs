//! How the command line reports an error: one line, its cause chain without repetition, and
//! an exit status that tells bad input (2) from a failure of the sandbox or engine (125).

pub use crate::oneshot::args::{usage, Usage};
use std::fmt::Write;

/// Exit status of a usage or input error: a bad option, config, template, action file or
/// fault spec (clap's own usage errors exit 2 as well).
pub const EXIT_USAGE: i32 = 2;

/// The message of `e`: each cause once. Most errors already print their source (`file:
/// reason`), so a cause whose text was already said is left out rather than repeated.
pub fn message(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        let _ = write!(out, "{text}");
    }
    out
}

/// The exit status of a failed command: [`EXIT_USAGE`] when the first classified error of the
/// chain is bad input, else the sandbox-failure status 125.
pub fn exit_code(e: &anyhow::Error) -> i32 {
    for cause in e.chain() {
        if let Some(input) = is_input(cause) {
            return if input {
                EXIT_USAGE
            } else {
                super::sandbox::EXIT_SANDBOX_FAILURE
            };
        }
    }
    super::sandbox::EXIT_SANDBOX_FAILURE
}

/// Whether an error is bad input (`Some(true)`), a failure (`Some(false)`), or says nothing
/// about it (a context line: look further down the chain).
fn is_input(e: &(dyn std::error::Error + 'static)) -> Option<bool> {
    use engine::experiment::ExperimentError as X;
    use engine::perturb::PerturbError as P;
    use engine::template::TemplateError as T;
    if e.is::<Usage>()
        || e.is::<engine::text::TextError>()
        || e.is::<engine::units::UnitError>()
        || e.is::<engine::actions::ActionsError>()
    {
        return Some(true);
    }
    if let Some(t) = e.downcast_ref::<T>() {
        return Some(!matches!(t, T::Synthesis { .. }));
    }
    if let Some(x) = e.downcast_ref::<X>() {
        return match x {
            X::Read(_)
            | X::Parse { .. }
            | X::Invalid { .. }
            | X::Output { .. }
            | X::Resume { .. }
            | X::Config { .. } => Some(true),
            X::Template(t) => Some(!matches!(t, T::Synthesis { .. })),
            _ => Some(false),
        };
    }
    if let Some(p) = e.downcast_ref::<P>() {
        return Some(matches!(
            p,
            P::Unknown(_) | P::UnknownParam { .. } | P::BadParam { .. } | P::BadSpec { .. }
        ));
    }
    if let Some(h) = e.downcast_ref::<engine::harbor::HarborError>() {
        return Some(h.is_bad_input());
    }
    if let Some(l) = e.downcast_ref::<sandbox::layers::LayerError>() {
        return Some(matches!(l, sandbox::layers::LayerError::UnknownRootfs(_)));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_are_said_once() {
        let inner = std::io::Error::other("disk full");
        let e = anyhow::Error::new(std::io::Error::other(format!("x.json: {inner}")))
            .context("writing the report");
        assert_eq!(message(&e), "writing the report: x.json: disk full");
    }

    #[test]
    fn input_errors_exit_2_and_failures_125() {
        let e = engine::units::parse_size("lots").unwrap_err();
        assert_eq!(exit_code(&anyhow::Error::new(e).context("--disk")), 2);
        assert_eq!(exit_code(&usage("--pids: at least 2")), 2);
        let e = engine::perturb::parse_spec("no-such-fault").unwrap_err();
        assert_eq!(exit_code(&anyhow::Error::new(e)), 2);
        assert_eq!(exit_code(&anyhow::anyhow!("the sandbox died")), 125);
    }
}
