//! Damaged data and writes that stopped, for both RocksDB databases (the offset store and the
//! embedded log): damage is refused, never read around (issue 43, item 3), and a write error that
//! stops RocksDB stops the gateway for its supervisor.

use std::path::{Path, PathBuf};

use rocksdb::Options;

/// RocksDB takes no more writes once one failed with an I/O error or damage (`paranoid_checks`: a full
/// disk, a failing device): every later write answers "Writer has previous error" until the
/// database is opened again, and RocksDB recovers from a full disk by itself only with an
/// `SstFileManager`, which the `rocksdb` crate cannot set. The first such error is kept here:
/// readiness turns false and the gateway stops with it (`Gateway::run`), so that its supervisor
/// starts it again, which opens the database again, instead of serving while no event can be
/// written and no ack stored (found by `loadtest chaos`, issue 43).
pub struct StoppedWrites {
    reason: std::sync::OnceLock<String>,
    /// The database's directory: where a damaged file found while serving is marked.
    dir: PathBuf,
}

/// The file in a database's directory that names a damaged file found while serving (a table
/// file whose block failed its checksum on a read): the next start refuses while that file is
/// there, instead of serving up to the damaged block again.
const DAMAGED_MARKER: &str = "DAMAGED";

impl StoppedWrites {
    pub fn for_dir(dir: &Path) -> Self {
        Self { reason: std::sync::OnceLock::new(), dir: dir.to_path_buf() }
    }

    /// Passes `e` on, keeping it when it is an I/O error or damage (a hard background error:
    /// RocksDB refuses every later write either way).
    pub fn check(&self, e: rocksdb::Error) -> rocksdb::Error {
        if matches!(e.kind(), rocksdb::ErrorKind::IOError | rocksdb::ErrorKind::Corruption) {
            let _ = self.reason.set(e.to_string());
        }
        e
    }

    /// Passes on the error of a read, stopping the database when it found damage: a table
    /// file's block that fails its checksum is found only when a read reaches it, and what it
    /// held must not be read around (a partition served past it, an offset read as absent). The
    /// gateway stops with the file named and marks it, so the next start refuses too.
    pub fn check_read(&self, e: rocksdb::Error) -> rocksdb::Error {
        if e.kind() == rocksdb::ErrorKind::Corruption && self.reason.get().is_none() {
            let said = e.to_string();
            // RocksDB names the file as it was opened (relative with a relative data_dir): the
            // marker keeps its name, always in this directory.
            let file = damaged_file(&said).map(|name| self.dir.join(name));
            if let Some(file) = &file {
                if let Err(e) = write_durably(&self.dir.join(DAMAGED_MARKER), file.display().to_string().as_bytes()) {
                    tracing::error!(error = %e, "writing the DAMAGED marker failed");
                }
            }
            let shown = file.as_ref().map_or_else(|| "a table file".to_string(), |f| f.display().to_string());
            let _ = self.reason.set(damage_message(&shown, &said, &self.dir));
        }
        e
    }

    /// The write error that stopped the database, if one did.
    pub fn reason(&self) -> Option<String> {
        self.reason.get().cloned()
    }
}

/// The name of the file a RocksDB corruption error names (`... in /data/log/000009.sst offset
/// 154650 size 3362`, or `data/log/...` with a relative data_dir), if it names one.
fn damaged_file(said: &str) -> Option<String> {
    said.split_whitespace()
        .map(|w| w.trim_end_matches([',', ':', ';']))
        .find(|w| w.ends_with(".sst") || w.ends_with(".log") || w.contains("MANIFEST-"))
        .and_then(|w| Path::new(w).file_name())
        .map(|name| name.to_string_lossy().into_owned())
}

/// Writes `bytes` to `path` and fsyncs it and its directory: a marker that must survive a crash.
fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut file = std::fs::File::create(path)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

fn damage_message(file: &str, said: &str, dir: &Path) -> String {
    format!("{file} is damaged ({said}): ackgate does not serve damaged data. Restore {} from a backup (docs/operations.md, \"Backups\")", dir.display())
}

/// Refuses to open a database whose damaged file, marked while serving (`check_read`), is still
/// there; a marker whose file is gone (the directory was restored) is removed.
pub fn refuse_if_marked_damaged(dir: &Path) -> Result<(), String> {
    let marker = dir.join(DAMAGED_MARKER);
    let Ok(named) = std::fs::read_to_string(&marker) else { return Ok(()) };
    // The file of that name in this directory (the data dir may have moved since).
    let file = Path::new(named.trim()).file_name().map(|name| dir.join(name));
    if let Some(file) = file.filter(|f| f.exists()) {
        let found = format!("found while serving; {} names it, remove that marker once the file is a good copy again", marker.display());
        return Err(damage_message(&file.display().to_string(), &found, dir));
    }
    let _ = std::fs::remove_file(&marker);
    Ok(())
}

/// A damaged file stops the start instead of being read around (issue 43, item 3). RocksDB's
/// default WAL recovery ("point in time") stops replaying at the first record whose checksum
/// fails and opens with everything after it gone: one flipped bit in the middle of the embedded
/// log's WAL silently dropped six of eight acknowledged events. Only a record cut short at the
/// very end of a WAL (a crash in the middle of a write, never acknowledged) is passed over now;
/// any other damage is an error naming the file, and the gateway refuses to start. Paranoid
/// checks (RocksDB's default, kept explicit) do the same for the MANIFEST and table files.
pub fn refuse_corruption(opts: &mut Options) {
    opts.set_wal_recovery_mode(rocksdb::DBRecoveryMode::TolerateCorruptedTailRecords);
    opts.set_paranoid_checks(true);
}

/// An error opening the RocksDB database in `dir`, said so an operator can act on it: damage
/// (a failed checksum, a file cut short) names the damaged file, which RocksDB writes only to its
/// own `LOG`, and says what to do.
pub fn open_error(dir: &Path, e: rocksdb::Error) -> String {
    let said = e.to_string();
    if e.kind() != rocksdb::ErrorKind::Corruption {
        return said;
    }
    let log = std::fs::read_to_string(dir.join("LOG")).unwrap_or_default();
    let dir_text = dir.display().to_string();
    // `[WARN] ... /data/log/000004.log: dropping 534 bytes; Corruption: checksum mismatch`
    let damaged = log.lines().rev().filter(|l| l.contains("Corruption")).find_map(|l| {
        let at = l.find(dir_text.as_str())?;
        l[at..].split([':', ' ', ',']).next().map(str::to_string)
    });
    let file = damaged.unwrap_or_else(|| format!("a file in {dir_text} (RocksDB's log, {dir_text}/LOG, says which)"));
    format!(
        "{file} is damaged ({said}): ackgate does not start on damaged data. Restore the data dir from a backup (docs/operations.md, \"Backups\"), \
         or move that file away to start without what it held"
    )
}

#[cfg(test)]
mod damage_tests {
    use super::*;

    #[test]
    fn the_damaged_file_is_read_from_rocksdbs_message() {
        let said = "Corruption: block checksum mismatch: stored(context removed) = 1, computed = 2, type = 4  in /data/log/000009.sst offset 154650 size 3362, block_type = Data";
        assert_eq!(damaged_file(said).as_deref(), Some("000009.sst"));
        assert_eq!(damaged_file("Corruption: bad record length in /d/offsets/000004.log: x").as_deref(), Some("000004.log"));
        assert_eq!(damaged_file("Corruption: block checksum mismatch in data/log/000012.sst offset 0").as_deref(), Some("000012.sst"), "a relative data_dir");
        assert_eq!(damaged_file("Corruption: something"), None);
    }

    #[test]
    fn a_marked_file_refuses_the_open_until_it_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let damaged = dir.path().join("000009.sst");
        std::fs::write(&damaged, b"x").unwrap();
        std::fs::write(dir.path().join(DAMAGED_MARKER), damaged.display().to_string()).unwrap();
        let refused = refuse_if_marked_damaged(dir.path()).unwrap_err();
        assert!(refused.contains(&format!("{} is damaged", damaged.display())) && refused.contains("Backups"), "{refused}");
        std::fs::remove_file(&damaged).unwrap(); // restored from a backup without it
        assert!(refuse_if_marked_damaged(dir.path()).is_ok());
        assert!(!dir.path().join(DAMAGED_MARKER).exists(), "the stale marker is removed");
    }
}
