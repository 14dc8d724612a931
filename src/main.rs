//! The `sortie` command line: parses arguments and hands over to the io crate. No logic lives
//! here beyond wiring.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sortie_core::config::Config;

/// Sortie: an egress gateway that routes outbound HTTP/HTTPS work to egress workers.
#[derive(Parser)]
#[command(name = "sortie", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a static configuration file (TOML) and exit non-zero with the key and reason.
    CheckConfig {
        /// The configuration file.
        file: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { file } => check_config(&file),
    }
}

fn read(file: &PathBuf) -> Result<String, ExitCode> {
    std::fs::read_to_string(file).map_err(|e| {
        eprintln!("{}: {e}", file.display());
        ExitCode::from(2)
    })
}

fn check_config(file: &PathBuf) -> ExitCode {
    let text = match read(file) {
        Ok(t) => t,
        Err(code) => return code,
    };
    match Config::from_toml(&text) {
        Ok(c) => {
            println!(
                "{}: ok ({} deployment(s), {} worker(s), admin {}, object storage {})",
                file.display(),
                c.deployments.len(),
                c.workers.len(),
                if c.control.admin_listen.is_some() {
                    "enabled"
                } else {
                    "disabled"
                },
                if c.object_storage.enabled {
                    "enabled"
                } else {
                    "disabled"
                },
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            ExitCode::from(1)
        }
    }
}
