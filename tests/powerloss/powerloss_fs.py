#!/usr/bin/python3
"""A pass-through FUSE file system that forgets, at a power loss, every write no fsync covered.

    /usr/bin/python3 powerloss_fs.py BACKING MOUNTPOINT [FULL_FLAG]

Files live in BACKING. What a program writes to a file stays in this process's memory (the
"page cache") until it fsyncs the file: only then is it written to BACKING (the part written
since the last fsync). A power loss is this
process dying (SIGKILL, or SIGTERM, which exits without writing anything): the cached writes are
gone, and a new mount of BACKING shows each file as of its last fsync, as a machine that lost
power shows it (LazyFS does the same for Jepsen).

Directory entries are volatile too, as on ext4 mounted without `dirsync`: creating, renaming and
removing a file or a directory is undone by a power loss until the directory that holds the entry
is fsynced (`fsyncdir`; for a rename, either of its two directories). A new file that was fsynced
but whose directory was not is gone after the power comes back; so is everything under a new
directory whose parent was not fsynced. The operations are applied to BACKING at once and written
first to an undo journal beside it (BACKING.unsynced-dir-ops, removed files kept in
BACKING.graveyard until their removal is synced); the next mount undoes, newest first, what the
journal still holds.

While the file FULL_FLAG exists, the disk is full: writes, file creation and growing a file fail
with ENOSPC (the fault suite's full disk, `loadtest chaos`).

With POWERLOSS_FSYNC_LOG set, each fsync that wrote something appends the file's path to that
file: how many fsyncs a storm of subscribes costs (tests/api/power_loss.rs).

The tests (tests/api/power_loss.rs, `loadtest chaos`) mount it, run the gateway on it, cut the
power, and mount it again. Debian's `fuse` and `python3-fusepy` packages (scripts/prereqs) provide what it needs.
"""

import errno
import json
import os
import shutil
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
        # Directory operations no fsyncdir covered yet, oldest first: {"dirs": [...], "undo":
        # [...]}, each also a line of the journal file, written before the operation is applied.
        self.journal_path = self.backing + ".unsynced-dir-ops"
        self.graveyard = self.backing + ".graveyard"
        os.makedirs(self.graveyard, exist_ok=True)
        self.unsynced = []
        self.buried = 0

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
        with self.mutex:
            if os.path.lexists(self._real(path)):
                raise FuseOSError(errno.EEXIST)
            self._journal([path], [["remove", path]])
            self._errno(os.mkdir, self._real(path), mode)

    def rmdir(self, path):
        with self.mutex:
            if self._errno(os.listdir, self._real(path)):
                raise FuseOSError(errno.ENOTEMPTY)
            self._bury(path, [path])

    def chmod(self, path, mode):
        self._errno(os.chmod, self._real(path), mode)

    def chown(self, path, uid, gid):
        self._errno(os.chown, self._real(path), uid, gid)

    def utimens(self, path, times=None):
        self._errno(os.utime, self._real(path), times)

    def unlink(self, path):
        with self.mutex:
            self._bury(path, [path])
            self.cache.pop(path, None)
            self.dirty_from.pop(path, None)

    def rename(self, old, new):
        with self.mutex:
            if not os.path.lexists(self._real(old)):
                raise FuseOSError(errno.ENOENT)
            undo = [["rename", new, old]]
            if os.path.lexists(self._real(new)):
                if os.path.isdir(self._real(new)) and os.listdir(self._real(new)):
                    raise FuseOSError(errno.ENOTEMPTY)
                # The replaced entry comes back with the undone rename.
                undo.append(["restore", self._buried_name(), new])
            self._journal([old, new], undo)
            if len(undo) > 1:
                self._errno(os.rename, self._real(new), os.path.join(self.graveyard, undo[1][1]))
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
            if not os.path.lexists(self._real(path)):
                self._journal([path], [["remove", path]])
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
        """Makes durable every directory operation on an entry of `path`."""
        with self.mutex:
            kept = [op for op in self.unsynced if path not in op["dirs"]]
            if len(kept) == len(self.unsynced):
                return 0
            synced = [op for op in self.unsynced if path in op["dirs"]]
            self.unsynced = kept
            # The journal first: a kill before the graveyard is emptied leaves only files the
            # next mount removes anyway, never a record whose removed file is gone.
            tmp = self.journal_path + ".tmp"
            with open(tmp, "w") as f:
                f.writelines(json.dumps(op) + "\n" for op in kept)
            os.replace(tmp, self.journal_path)
            for op in synced:
                for action in op["undo"]:
                    if action[0] == "restore":
                        _remove_tree(os.path.join(self.graveyard, action[1]))
        return 0

    # The undo journal of directory operations.

    def _journal(self, paths, undo):
        """Records, before it is applied, an operation on the entries `paths` that `undo` reverses."""
        op = {"dirs": sorted({os.path.dirname(p) or "/" for p in paths}), "undo": undo}
        self.unsynced.append(op)
        with open(self.journal_path, "a") as f:
            f.write(json.dumps(op) + "\n")

    def _buried_name(self):
        self.buried += 1
        return "%d-%d" % (os.getpid(), self.buried)

    def _bury(self, path, paths):
        """Removes `path` into the graveyard, where it waits until the removal is synced."""
        if not os.path.lexists(self._real(path)):
            raise FuseOSError(errno.ENOENT)
        name = self._buried_name()
        self._journal(paths, [["restore", name, path]])
        self._errno(os.rename, self._real(path), os.path.join(self.graveyard, name))


def _remove_tree(real):
    if os.path.isdir(real) and not os.path.islink(real):
        shutil.rmtree(real, ignore_errors=True)
    elif os.path.lexists(real):
        os.unlink(real)


def undo_unsynced_dir_ops(backing):
    """At mount: the power came back, so every directory operation no fsyncdir covered is undone,
    newest first. Each undo tolerates what a kill halfway through an operation left."""
    backing = os.path.realpath(backing)
    journal, graveyard = backing + ".unsynced-dir-ops", backing + ".graveyard"
    real = lambda path: os.path.join(backing, path.lstrip("/"))
    ops = []
    if os.path.exists(journal):
        with open(journal) as f:
            for line in f:
                try:
                    ops.append(json.loads(line))
                except ValueError:
                    break  # a line cut by the kill: its operation was never applied
    for op in reversed(ops):
        for action in op["undo"]:
            try:
                if action[0] == "remove":
                    _remove_tree(real(action[1]))
                elif action[0] == "rename" and os.path.lexists(real(action[1])) and not os.path.lexists(real(action[2])):
                    # Only a rename that happened: killed before it, both names still stand.
                    os.rename(real(action[1]), real(action[2]))
                elif action[0] == "restore" and os.path.lexists(os.path.join(graveyard, action[1])):
                    _remove_tree(real(action[2]))
                    os.rename(os.path.join(graveyard, action[1]), real(action[2]))
            except OSError:
                # Its directory went too (an entry of a directory removed later): nothing to
                # put back where nothing can be reached.
                pass
    if os.path.exists(journal):
        os.unlink(journal)
    shutil.rmtree(graveyard, ignore_errors=True)


def main():
    backing, mountpoint = sys.argv[1], sys.argv[2]
    full_flag = sys.argv[3] if len(sys.argv) > 3 else None
    # SIGTERM is a power loss too: exit at once, writing nothing.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    undo_unsynced_dir_ops(backing)
    FUSE(PowerLossFs(backing, full_flag), mountpoint, foreground=True, nothreads=False)


if __name__ == "__main__":
    main()
