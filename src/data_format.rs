//! The format version of a `data_dir`: `<data_dir>/FORMAT` holds `ackgate data <version>`. Written
//! at the first start (a data_dir from before the file existed is version 1, which this version
//! reads); a version this build does not know stops the start with an error that names both,
//! never a silent misreading of stores written by another version (docs/compatibility.md).

use std::path::Path;

use anyhow::{bail, Context};

/// The version this build writes and reads.
const FORMAT_VERSION: u32 = 1;
const FILE: &str = "FORMAT";
const PREFIX: &str = "ackgate data ";

/// Checks `<data_dir>/FORMAT`, writing it (atomically) when absent.
pub fn check_or_write(data_dir: &Path) -> anyhow::Result<()> {
    if check(data_dir)? {
        return Ok(());
    }
    // Fsynced, with its directory: written with a rename alone, a power loss right after the
    // first start left an empty FORMAT, and the gateway refused to start again (found by
    // tests/api/power_loss.rs).
    let path = data_dir.join(FILE);
    crate::durable_files::write_atomically(&path, format!("{PREFIX}{FORMAT_VERSION}\n").as_bytes()).with_context(|| format!("writing {}", path.display()))
}

/// Checks `<data_dir>/FORMAT` without writing anything: true when it names this build's
/// version, false when there is none yet (a first start writes it), an error otherwise.
pub fn check(data_dir: &Path) -> anyhow::Result<bool> {
    let path = data_dir.join(FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let version = text.trim().strip_prefix(PREFIX).and_then(|v| v.parse::<u32>().ok());
            match version {
                Some(FORMAT_VERSION) => Ok(true),
                Some(other) => bail!(
                    "{} says data format {other}; this ackgate reads format {FORMAT_VERSION} (the data_dir was written by another version): run that version, or start with an empty data_dir",
                    path.display()
                ),
                None => bail!("{} is not a data format file (expected \"{PREFIX}<version>\", found {:?})", path.display(), text.trim()),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_format_file_is_written_once_and_an_unknown_version_stops_the_start() {
        let dir = tempfile::tempdir().unwrap();
        check_or_write(dir.path()).unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join(FILE)).unwrap(), "ackgate data 1\n");
        check_or_write(dir.path()).unwrap();
        std::fs::write(dir.path().join(FILE), "ackgate data 2\n").unwrap();
        let e = check_or_write(dir.path()).unwrap_err().to_string();
        assert!(e.contains("data format 2") && e.contains("reads format 1"), "{e}");
        for garbage in ["", "ackgate data", "ackgate data -1", "ackgate data 18446744073709551616", "rocksdb"] {
            std::fs::write(dir.path().join(FILE), garbage).unwrap();
            let e = check_or_write(dir.path()).unwrap_err().to_string();
            assert!(e.contains("is not a data format file"), "{garbage:?}: {e}");
        }
    }
}
