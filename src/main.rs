use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    sekali::cli::run(sekali::cli::Cli::parse())
}
