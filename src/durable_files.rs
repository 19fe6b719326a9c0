//! Files and directories that must be there after a power loss. A file's fsync makes its data
//! durable, not its name: the entry lives in the directory, which needs an fsync of its own
//! (ext4 without `dirsync`, XFS; the fault suite's power-loss file system forgets an entry until
//! then). So every file or directory the gateway creates for good is followed by an fsync of the
//! directory that holds it.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Replaces the file at `path` with `bytes` so that a crash leaves the old file or the new one:
/// a temp file, fsynced, renamed over it, the directory fsynced.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    {
        let mut file = fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        // Make the rename itself durable.
        sync_dir(dir)?;
    }
    Ok(())
}

/// `fs::create_dir_all`, and each directory it made is fsynced into its parent: without that, a
/// power loss right after a first start can take the data dir (and everything written in it) away.
pub fn create_dir_all(path: &Path) -> io::Result<()> {
    if path.is_dir() {
        return Ok(());
    }
    let mut missing = Vec::new();
    let mut at = Some(path);
    while let Some(dir) = at.filter(|dir| !dir.as_os_str().is_empty() && !dir.exists()) {
        missing.push(dir);
        at = dir.parent();
    }
    fs::create_dir_all(path)?;
    // Outermost first: a parent's entry is durable before its children's are written.
    for dir in missing.iter().rev() {
        sync_dir(dir.parent().filter(|parent| !parent.as_os_str().is_empty()).unwrap_or(Path::new(".")))?;
    }
    Ok(())
}

/// Makes the entries of `dir` (files created, renamed or removed in it) durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_dir_all_makes_every_missing_level_and_accepts_one_that_exists() {
        let root = tempfile::tempdir().unwrap();
        let deep = root.path().join("a/b/c");
        create_dir_all(&deep).unwrap();
        assert!(deep.is_dir());
        create_dir_all(&deep).unwrap();
        let file = root.path().join("a/file");
        fs::write(&file, b"x").unwrap();
        assert!(create_dir_all(&file).is_err(), "a file where a directory should be is an error");
    }

    #[test]
    fn write_atomically_replaces_the_whole_file_and_leaves_no_temp_file() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("f");
        write_atomically(&path, b"first, longer").unwrap();
        write_atomically(&path, b"second").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"second");
        assert_eq!(fs::read_dir(root.path()).unwrap().count(), 1);
    }
}
