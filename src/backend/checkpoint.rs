//! Pull cursors and their checkpoint file.
//!
//! The file is a properties file, one `pull key=offset` line per cursor (`topic#partition`, or
//! `parent#lite@queue` for a RocketMQ lite topic: `TopicPartition::pull_key`). It is replaced
//! atomically (write a temp file, fsync it, rename it over the old one, fsync the directory), so a
//! crash during a checkpoint leaves either the old file or the new one, never a torn mix.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::core::names::{TopicName, TopicPartition};

/// Name of the checkpoint file inside `storage.data_dir`.
pub const CHECKPOINT_FILE: &str = "pull-offsets.properties";

/// The pull cursor of every `topic#partition` this instance reads, plus where it is checkpointed.
pub struct PullCursors {
    path: PathBuf,
    cursors: Mutex<BTreeMap<TopicPartition, u64>>,
}

impl PullCursors {
    /// Loads the checkpoint at `path` when there is one.
    pub fn load(path: PathBuf) -> io::Result<Self> {
        let cursors = read_checkpoint(&path)?;
        Ok(Self { path, cursors: Mutex::new(cursors) })
    }

    pub fn get(&self, tp: &TopicPartition) -> Option<u64> {
        self.lock().get(tp).copied()
    }

    pub fn set(&self, tp: &TopicPartition, offset: u64) {
        self.lock().insert(tp.clone(), offset);
    }

    pub fn remove_topic(&self, topic: &TopicName) {
        self.lock().retain(|tp, _| tp.topic != *topic);
    }

    /// Writes every cursor to the checkpoint file, atomically.
    pub fn save(&self) -> io::Result<()> {
        let snapshot = self.lock().clone();
        write_checkpoint(&self.path, &snapshot)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<TopicPartition, u64>> {
        // A poisoned lock only means another thread panicked mid-insert; the map is still valid.
        self.cursors.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Reads a checkpoint file; a missing file is an empty checkpoint. Lines that do not parse are
/// skipped with a warning rather than failing the start.
fn read_checkpoint(path: &Path) -> io::Result<BTreeMap<TopicPartition, u64>> {
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(e),
    };
    let mut cursors = BTreeMap::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        match parse_line(line) {
            Some((tp, offset)) => {
                cursors.insert(tp, offset);
            }
            None => tracing::warn!(file = %path.display(), line, "skipping unreadable pull checkpoint line"),
        }
    }
    Ok(cursors)
}

fn parse_line(line: &str) -> Option<(TopicPartition, u64)> {
    let (key, offset) = line.split_once('=')?;
    Some((TopicPartition::parse_pull_key(key)?, offset.parse().ok()?))
}

/// Replaces the checkpoint file atomically.
fn write_checkpoint(path: &Path, cursors: &BTreeMap<TopicPartition, u64>) -> io::Result<()> {
    let mut text = String::from("# ackgate pull offsets: topic#partition (parent#lite@queue) = next offset to pull\n");
    for (tp, offset) in cursors {
        text.push_str(&format!("{}={offset}\n", tp.pull_key()));
    }
    crate::durable_files::write_atomically(path, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(topic: &str, partition: u32) -> TopicPartition {
        TopicPartition::new(TopicName::parse(topic).unwrap(), partition)
    }

    #[test]
    fn saves_and_loads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CHECKPOINT_FILE);
        let cursors = PullCursors::load(path.clone()).unwrap();
        cursors.set(&tp("orders", 0), 17);
        cursors.set(&tp("a.b-c_d", 3), 0);
        cursors.set(&tp("chat@room-42", 1), 9);
        cursors.save().unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.contains("\nchat#room-42@1=9\n") && text.contains("\norders#0=17\n"), "{text}");
        let again = PullCursors::load(path.clone()).unwrap();
        assert_eq!(again.get(&tp("orders", 0)), Some(17));
        assert_eq!(again.get(&tp("a.b-c_d", 3)), Some(0));
        assert_eq!(again.get(&tp("chat@room-42", 1)), Some(9));
        assert_eq!(again.get(&tp("orders", 1)), None);
        assert!(!path.with_extension("properties.tmp").exists(), "the temp file is renamed away");
    }

    #[test]
    fn a_crash_during_a_write_leaves_the_previous_file_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CHECKPOINT_FILE);
        write_checkpoint(&path, &[(tp("t", 0), 5)].into()).unwrap();
        // A crash in the middle of the next checkpoint leaves a half-written temp file behind.
        fs::write(path.with_extension("properties.tmp"), "t#0=9\nt#1=").unwrap();
        assert_eq!(read_checkpoint(&path).unwrap(), [(tp("t", 0), 5)].into());
        // The next checkpoint replaces the leftover and the file.
        write_checkpoint(&path, &[(tp("t", 0), 6)].into()).unwrap();
        assert_eq!(read_checkpoint(&path).unwrap(), [(tp("t", 0), 6)].into());
    }

    #[test]
    fn unreadable_lines_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CHECKPOINT_FILE);
        fs::write(&path, "# c\nt#0=3\ngarbage\nbad#x=1\nt#1=-4\n").unwrap();
        assert_eq!(read_checkpoint(&path).unwrap(), [(tp("t", 0), 3)].into());
    }
}
