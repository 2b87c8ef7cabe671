//! What the CLI writes on standard output. A reader that went away (`cudapool stat | head -1`)
//! ends the command quietly with status 0: never a panic, never a message.

use std::io::Write;

/// Writes `text` to standard output and flushes it.
pub fn out(text: &str) {
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_all(text.as_bytes()).and_then(|()| o.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
    }
}

/// [`out`] with a newline.
pub fn outln(text: &str) {
    out(&format!("{text}\n"));
}
