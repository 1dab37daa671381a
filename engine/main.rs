//! `engine-core`, the engine program: the `engine` command line over the `engine`
//! library, the commands in `cli/`, one file per command group. Users run the `engine` front
//! (`front.rs`), which serves one-shots a daemon answers and hands every other command line
//! to this program.

#[macro_use]
mod cli;
mod oneshot;

fn main() {
    cli::front_build_matches();
    // The sandbox init must start before anything else (no threads, no logging).
    if std::env::args().nth(1).as_deref() == Some("__sandbox-init") {
        sandbox::init::main();
    }
    let cli = cli::Cli::from_args();
    // `engine sandbox exec` starts the watcher thread once its sandbox's init is started: with
    // a single thread until then, that init is forked from this process, not exec'd.
    cli::signals::install(!cli.command.is_one_shot());
    oneshot::client::set_log_filter(&cli.logging.log);
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&cli.logging.log).unwrap_or_else(|_| {
                eprintln!(
                    "engine: bad --log filter {:?}; using `warn`",
                    cli.logging.log
                );
                tracing_subscriber::EnvFilter::new("warn")
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = cli::run(cli.command);
    // (A one-shot may have no signal watcher yet: `before_exit` starts one if a signal came.)
    cli::signals::before_exit();
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("engine: {}", cli::errors::message(&e));
            std::process::exit(cli::errors::exit_code(&e));
        }
    }
}
