#!/usr/bin/python3
"""A pass-through FUSE file system that forgets, at a power loss, every write no fsync covered.

    /usr/bin/python3 powerloss_fs.py BACKING MOUNTPOINT [FULL_FLAG]

Files live in BACKING. What a program writes to a file stays in this process's memory (the
"page cache") until it fsyncs the file: only then is it written to BACKING (the part written
since the last fsync). A power loss is this
process dying (SIGKILL, or SIGTERM, which exits without writing anything): the cached writes are
gone, and a new mount of BACKING shows each file as of its last fsync, as a machine that lost
power shows it (LazyFS does the same for Jepsen). Creating, renaming and removing files and
directories reach BACKING at once (they are not what this models).

While the file FULL_FLAG exists, the disk is full: writes, file creation and growing a file fail
with ENOSPC (the fault suite's full disk, `loadtest chaos`).

With POWERLOSS_FSYNC_LOG set, each fsync that wrote something appends the file's path to that
file: how many fsyncs a storm of subscribes costs (tests/api/power_loss.rs).

The tests (tests/api/power_loss.rs, `loadtest chaos`) mount it, run the gateway on it, cut the
power, and mount it again. Debian's `fuse` and `python3-fusepy` packages (scripts/prereqs) provide what it needs.
"""

import errno
import os
import signal
import sys
import threading

from fusepy import FUSE, FuseOSError, Operations


class PowerLossFs(Operations):
    def __init__(self, backing, full_flag=None):
        self.backing = os.path.realpath(backing)
        self.full_flag = full_flag
        self.fsync_log = os.environ.get("POWERLOSS_FSYNC_LOG")
        self.mutex = threading.RLock()
        # path -> bytearray: a file's whole content as this process knows it (the "page cache"),
        # kept from its first write on.
        self.cache = {}
        # path -> the lowest offset written (or truncated to) since the file's last fsync: an
        # fsync writes from there on, not the whole file again.
        self.dirty_from = {}

    def _refuse_when_full(self):
        if self.full_flag is not None and os.path.exists(self.full_flag):
            raise FuseOSError(errno.ENOSPC)

    def _dirty(self, path, offset):
        self.dirty_from[path] = min(offset, self.dirty_from.get(path, offset))

    def _real(self, path):
        return os.path.join(self.backing, path.lstrip("/"))

    def _content(self, path):
        """The file's content as written so far, cached from here until its next fsync."""
        content = self.cache.get(path)
        if content is None:
            with open(self._real(path), "rb") as f:
                content = bytearray(f.read())
            self.cache[path] = content
        return content

    def _errno(self, call, *args):
        try:
            return call(*args)
        except OSError as e:
            raise FuseOSError(e.errno or errno.EIO)

    # Metadata: straight to the backing directory.

    def getattr(self, path, fh=None):
        st = self._errno(os.lstat, self._real(path))
        attrs = {key: getattr(st, key) for key in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime", "st_mtime", "st_ctime")}
        with self.mutex:
            if path in self.cache:
                attrs["st_size"] = len(self.cache[path])
        return attrs

    def access(self, path, mode):
        if not os.access(self._real(path), mode):
            raise FuseOSError(errno.EACCES)

    def readdir(self, path, fh):
        return [".", ".."] + self._errno(os.listdir, self._real(path))

    def statfs(self, path):
        st = self._errno(os.statvfs, self._real(path))
        return {key: getattr(st, key) for key in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

    def mkdir(self, path, mode):
        self._refuse_when_full()
        self._errno(os.mkdir, self._real(path), mode)

    def rmdir(self, path):
        self._errno(os.rmdir, self._real(path))

    def chmod(self, path, mode):
        self._errno(os.chmod, self._real(path), mode)

    def chown(self, path, uid, gid):
        self._errno(os.chown, self._real(path), uid, gid)

    def utimens(self, path, times=None):
        self._errno(os.utime, self._real(path), times)

    def unlink(self, path):
        with self.mutex:
            self._errno(os.unlink, self._real(path))
            self.cache.pop(path, None)
            self.dirty_from.pop(path, None)

    def rename(self, old, new):
        with self.mutex:
            self._errno(os.rename, self._real(old), self._real(new))
            self.cache.pop(new, None)
            self.dirty_from.pop(new, None)
            if old in self.cache:
                self.cache[new] = self.cache.pop(old)
            if old in self.dirty_from:
                self.dirty_from[new] = self.dirty_from.pop(old)

    # Data: cached until fsync.

    def create(self, path, mode, fi=None):
        self._refuse_when_full()
        with self.mutex:
            fd = self._errno(os.open, self._real(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
            os.close(fd)
            self.cache.pop(path, None)
            self.dirty_from.pop(path, None)
        return 0

    def open(self, path, flags):
        with self.mutex:
            if not os.path.exists(self._real(path)):
                raise FuseOSError(errno.ENOENT)
            if flags & os.O_TRUNC:
                self._content(path).clear()
                self._dirty(path, 0)
        return 0

    def read(self, path, size, offset, fh):
        with self.mutex:
            if path in self.cache:
                return bytes(self.cache[path][offset:offset + size])
            with open(self._real(path), "rb") as f:
                f.seek(offset)
                return f.read(size)

    def write(self, path, data, offset, fh):
        self._refuse_when_full()
        with self.mutex:
            content = self._content(path)
            self._dirty(path, min(offset, len(content)))
            if offset > len(content):
                content.extend(b"\0" * (offset - len(content)))
            content[offset:offset + len(data)] = data
        return len(data)

    def truncate(self, path, length, fh=None):
        with self.mutex:
            content = self._content(path)
            if length > len(content):
                self._refuse_when_full()
            self._dirty(path, min(length, len(content)))
            if length < len(content):
                del content[length:]
            else:
                content.extend(b"\0" * (length - len(content)))

    def fsync(self, path, datasync, fh):
        with self.mutex:
            content = self.cache.get(path)
            dirty_from = self.dirty_from.pop(path, None)
            if content is None or dirty_from is None:
                return 0
            with open(self._real(path), "r+b") as f:
                f.seek(dirty_from)
                f.write(content[dirty_from:])
                f.truncate(len(content))
                f.flush()
                os.fsync(f.fileno())
            if self.fsync_log:
                with open(self.fsync_log, "a") as log:
                    log.write(path + "\n")
        return 0

    def flush(self, path, fh):
        return 0  # close() makes nothing durable

    def release(self, path, fh):
        return 0

    def fsyncdir(self, path, datasync, fh):
        return 0


def main():
    backing, mountpoint = sys.argv[1], sys.argv[2]
    full_flag = sys.argv[3] if len(sys.argv) > 3 else None
    # SIGTERM is a power loss too: exit at once, writing nothing.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    FUSE(PowerLossFs(backing, full_flag), mountpoint, foreground=True, nothreads=False)


if __name__ == "__main__":
    main()
