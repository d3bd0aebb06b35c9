//! The command line. [`args`] says what each command takes; `commands` does it, each command
//! returning a `Result` that [`run`] turns into the process's exit status, printing an error
//! once, as `error: …`.

pub mod args;
mod commands;

use std::process::ExitCode;

pub use args::{Cli, Command};

use crate::domain::text::Escaped;

/// Runs a parsed command line; errors are printed to stderr as `error: …`.
pub fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Serve(args) => commands::serve(*args),
        Command::Purge(args) => commands::purge(args),
        Command::Backup(args) => commands::backup(args),
        Command::Copy(args) => commands::copy(args),
        Command::Replay(args) => commands::replay(args),
        Command::Bench(args) => commands::bench(args),
        Command::Events(command) => commands::events(command),
        Command::Orders(args::OrdersCommand::SetStatus {
            id,
            status,
            reason,
            by,
            db,
        }) => commands::set_status(&id, status, reason, by, &db),
        Command::Relay(args) => commands::relay(args),
        Command::Outbox(command) => commands::outbox(command),
        Command::Forward(command) => commands::forward(command),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            // With its causes: a database server's error is "db error" by itself, and says
            // what the server reported in its source.
            eprintln!("error: {}", crate::telemetry::ErrorChain(&*e));
            ExitCode::FAILURE
        }
    }
}

/// Writes a command's output to stdout (through [`outln!`](crate::outln)). A reader that has
/// gone away (`sekali events list | head`) is not an error: the rest of the output is dropped
/// and the command's exit status stands, where `println!` would panic. Any other failure to
/// write (a full disk behind a redirect) ends the command with an error.
pub fn write_stdout(text: std::fmt::Arguments<'_>) {
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};
    static READER_GONE: AtomicBool = AtomicBool::new(false);
    if READER_GONE.load(Ordering::Relaxed) {
        return;
    }
    if let Err(e) = std::io::stdout().lock().write_fmt(text) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            READER_GONE.store(true, Ordering::Relaxed);
        } else {
            eprintln!("error: writing to standard output: {e}");
            std::process::exit(1);
        }
    }
}

/// Prints `value` as one line of JSON: a listing's `--json` is JSON Lines, one object per line,
/// for `jq` and the like. The text is what a terminal gets, so it is escaped as a table's cells
/// are, in JSON's own way: serde_json escapes the control characters U+0000–U+001F in strings
/// (a line break in an id is `\n`, so an object never spans two lines), and
/// [`escaped_json`](crate::domain::text::escaped_json) writes as `\u` escapes what it leaves
/// raw (DEL, the C1 controls, bidi overrides, invisible characters). A JSON reader reads the
/// stored values unchanged.
pub(crate) fn print_json_line(value: &impl serde::Serialize) {
    let line = serde_json::to_string(value).expect("a listing's row serialises");
    crate::outln!("{}", crate::domain::text::escaped_json(&line));
}

/// Prints a header and rows in columns two spaces apart, each as wide as its widest cell, so a
/// long event type or order id does not push the columns after it out of line.
pub(crate) fn print_columns<const N: usize>(header: [&str; N], rows: Vec<[String; N]>) {
    // Cells come from the database, and ids from webhooks are whatever a stranger sent: each is
    // escaped, so an id with ESC or CR cannot recolour the terminal or forge a row.
    let rows: Vec<[String; N]> = rows
        .into_iter()
        .map(|row| row.map(|cell| Escaped(&cell).to_string()))
        .collect();
    let mut widths = header.map(|h| h.chars().count());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; N]| {
        let mut line = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 < N {
                line.push_str(&format!("{cell:<width$}  ", width = widths[i]));
            } else {
                line.push_str(cell);
            }
        }
        crate::outln!("{}", line.trim_end());
    };
    line(header);
    for row in &rows {
        line(row.each_ref().map(String::as_str));
    }
}
