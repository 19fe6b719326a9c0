//! A mount of `tests/powerloss/powerloss_fs.py`: a FUSE file system whose files reach the backing
//! directory only when fsynced, so that killing it is a power loss (as LazyFS does for Jepsen),
//! and whose disk is full while a flag file exists. Used by `loadtest chaos` and, through
//! `#[path]`, by tests/api/power_loss.rs; it needs Debian's `fuse` and `python3-fusepy`
//! (scripts/prereqs) and root for `/dev/fuse`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct PowerLossMount {
    script: PathBuf,
    backing: PathBuf,
    mountpoint: PathBuf,
    full_flag: Option<PathBuf>,
    fs: Option<Child>,
}

impl PowerLossMount {
    /// Mounts `backing` at `mountpoint` with the file system `script`; while `full_flag` exists,
    /// writes fail with ENOSPC.
    pub fn mount(script: &Path, backing: &Path, mountpoint: &Path, full_flag: Option<&Path>) -> std::io::Result<Self> {
        std::fs::create_dir_all(backing)?;
        std::fs::create_dir_all(mountpoint)?;
        // Debian's python3, which holds Debian's fusepy, whatever `python3` the PATH names first.
        let mut command = Command::new("/usr/bin/python3");
        command.arg(script).arg(backing).arg(mountpoint).env("POWERLOSS_FSYNC_LOG", Self::fsync_log_of(backing));
        if let Some(flag) = full_flag {
            command.arg(flag);
        }
        let fs = command.stdout(Stdio::null()).spawn()?;
        let mut mount = Self {
            script: script.to_path_buf(),
            backing: backing.to_path_buf(),
            mountpoint: mountpoint.to_path_buf(),
            full_flag: full_flag.map(Path::to_path_buf),
            fs: Some(fs),
        };
        let started = Instant::now();
        while !mount.is_mounted() {
            if started.elapsed() > Duration::from_secs(20) || mount.fs.as_mut().is_some_and(|fs| matches!(fs.try_wait(), Ok(Some(_)))) {
                mount.unmount();
                return Err(std::io::Error::other(format!("{} was not mounted (are `fuse` and `python3-fusepy` installed?)", mountpoint.display())));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(mount)
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Beside the backing directory: every fsync's path, one per line, kept across power cuts.
    fn fsync_log_of(backing: &Path) -> PathBuf {
        backing.with_extension("fsyncs")
    }

    /// How many fsyncs that wrote something went to a file whose path (from the mount's root)
    /// contains `part`, since the first mount.
    pub fn fsyncs(&self, part: &str) -> usize {
        std::fs::read_to_string(Self::fsync_log_of(&self.backing)).unwrap_or_default().lines().filter(|path| path.contains(part)).count()
    }

    fn is_mounted(&self) -> bool {
        let wanted = self.mountpoint.display().to_string();
        std::fs::read_to_string("/proc/self/mounts").unwrap_or_default().lines().any(|line| line.split(' ').nth(1) == Some(wanted.as_str()))
    }

    /// The power goes: the file system dies with every write no fsync covered, and the mount goes
    /// with it. The programs using it must be dead first (a process writing to a dying FUSE mount
    /// gets errors, not a power loss).
    pub fn cut_power(&mut self) {
        self.unmount();
    }

    /// The power comes back: the same backing directory mounted again, as of its last fsyncs.
    pub fn power_on(&mut self) -> std::io::Result<()> {
        self.unmount();
        let again = Self::mount(&self.script, &self.backing, &self.mountpoint, self.full_flag.as_deref())?;
        *self = again;
        Ok(())
    }

    /// The disk fills up (`true`) or gets room again.
    pub fn set_full(&self, full: bool) -> std::io::Result<()> {
        let Some(flag) = &self.full_flag else { return Err(std::io::Error::other("mounted without a full flag")) };
        if full {
            std::fs::write(flag, b"full")
        } else {
            match std::fs::remove_file(flag) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        }
    }

    fn unmount(&mut self) {
        if let Some(mut fs) = self.fs.take() {
            let _ = fs.kill();
            let _ = fs.wait();
            let _ = Command::new("umount").arg("-l").arg(&self.mountpoint).status();
        }
    }
}

impl Drop for PowerLossMount {
    fn drop(&mut self) {
        self.unmount();
    }
}
