//! A lossy FUSE filesystem for power-cut tests. It keeps, for every file and directory, what
//! reads see now and what would survive a power cut; [`LossyMount::cut`] drops the difference.
//!
//! # What it models
//!
//! - **File data.** Each regular file has its *current* bytes (what reads see) and its *durable*
//!   bytes. `write` and `setattr(size)` (truncate or extend) change the current bytes only.
//!   `fsync` of the file (FUSE `FSYNC`: `fsync(2)` and `fdatasync(2)` alike) makes the durable
//!   bytes equal the current bytes; `flush` and `release` (`close(2)`) do not.
//! - **Directory entries.** Each directory has current and durable entries. `create`, `mkdir`,
//!   `unlink`, `rmdir` and `rename` (also over an existing target) change the current entries
//!   only; `fsyncdir` (`fsync(2)` on the directory) makes them durable. This is the strict POSIX
//!   model: a new name, an unlink or a rename is durable only once its directory is synced, and
//!   syncing a file says nothing about its name. It is stricter than ext4, which journals
//!   metadata and in practice often keeps names without a directory sync: code that survives
//!   this survives ext4.
//! - **Names kept by `fsync` (opt-in: [`Options::fsync_keeps_names`]).** An `fsync` of a file
//!   or directory also makes durable the names that lead to it from the root: the entries that
//!   name it now (its old names, unlinked or renamed away, go), and so on up for the directories
//!   on the way. POSIX does not promise it; Linux's filesystems do it (ext4 and XFS commit their
//!   journal up to the inode's creation, with the entry made with it; btrfs logs the new names
//!   of an fsynced inode and of its new parents), and PostgreSQL counts on it: it syncs no
//!   directory after creating a relation file, nor `base/` after creating a database's
//!   directory. Off (the default), only `fsyncdir` makes names durable.
//! - **The cut** reverts every directory to its durable entries, forgets the inodes no longer
//!   reachable from the root, and reverts every remaining file to its durable bytes. Unlinked
//!   inodes are kept until then: a durable entry may still name them (a file replaced by an
//!   unsynced rename comes back).
//!
//! It is all in memory, with no backing directory: that is the simplest faithful model, the two
//! versions are all there is, where a backing filesystem would add its own cache and journal to
//! reason about.
//!
//! # What it does not model
//!
//! - Torn writes: all unsynced data is dropped, none kept (a real disk may keep any part of it);
//!   reordering: nothing becomes durable without a sync; a cut during an `fsync`.
//! - Metadata (mode, times, uid/gid) is not versioned: it stays current. Sizes follow the data.
//! - Extended attributes, hard links, symlinks, special files, `fallocate` (the kernel answers
//!   `EOPNOTSUPP` and glibc's `posix_fallocate` writes zeros instead), `RENAME_EXCHANGE` and
//!   `RENAME_WHITEOUT` (`EINVAL`). Link counts are computed from the current entries.
//! - A directory renamed with only one of its two parents synced may have two parents or none
//!   after a cut; real filesystems journal a rename as one transaction.
//!
//! # Kernel caching and locks
//!
//! Entries and attributes have a TTL of zero: the kernel asks on every path walk and `stat`, and
//! never serves a name or a size from before a cut. Files are opened without `FOPEN_KEEP_CACHE`,
//! so the kernel drops an inode's page cache on each open: after a cut, processes must reopen
//! their files (they do: the cut killed them). fuser 0.18 negotiates only `FUSE_ASYNC_READ`,
//! `FUSE_BIG_WRITES` and `FUSE_MAX_PAGES` (`INIT_FLAGS` in its `lib.rs`): without
//! `FUSE_WRITEBACK_CACHE` every `write(2)` reaches this filesystem before it returns (writes to a
//! shared `mmap`, such as SQLite's `-shm`, when the kernel writes the pages back, at the latest on
//! `close`), and without `FUSE_POSIX_LOCKS`/`FUSE_FLOCK_LOCKS` the kernel keeps `fcntl` and
//! `flock` locks locally, which is what SQLite needs (`getlk`/`setlk` are not implemented).
//!
//! # Rules for tests
//!
//! Cut only once every process using the mount has been killed, or, in-process, every file and
//! connection on it closed: a power cut kills them, and one that lived on would hold descriptors
//! to inodes that may no longer exist (`ENOENT`). The kernel may still send `release` and
//! `forget` for those after the cut: they are answered without complaint. Declare the
//! [`LossyMount`] before what uses it, so that it is dropped after them, also on a panic.
//!
//! # A process of its own
//!
//! The filesystem is served by a child process ([`serve`], the test binary started again with
//! [`SERVE_ENV`] set), never by the test process. A FUSE server must not be a client of its own
//! mount: the tests' SQLite connections map their WAL index (`-shm`) from files on the mount,
//! and when such a mapping goes (`munmap`, with the process's memory map locked for writing),
//! the kernel writes its dirty pages back and waits for the server (`fuse_vma_close`); a server
//! thread in the same process that then needs the memory map's lock (to fault in its buffer)
//! waits for ever. Seen once as a power-cut suite that stopped after its first test, with `ps`
//! hanging on the process. The test speaks to the server over the child's standard input and
//! output, one line each way per request ([`LossyMount::cut`], [`LossyMount::counters`]).
//!
//! fuser's one session thread serves every request; the state is behind a [`Mutex`] shared with
//! the request loop through an [`Arc`], and a poisoned lock is taken over, not propagated.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    AccessFlags, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    SessionACL, TimeOrNow, WriteFlags,
};

/// Time the kernel may cache an entry or attributes: none, see the module documentation.
const TTL: Duration = Duration::ZERO;
const ROOT: u64 = INodeNo::ROOT.0;

/// What one power cut threw away.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CutReport {
    /// Files (still reachable after the cut) whose current bytes differed from their durable
    /// bytes.
    pub files_reverted: usize,
    /// Bytes of those files that reads saw and the cut changed: the positions, over the longer
    /// of the two versions, where the current and the durable bytes differ.
    pub bytes_dropped: u64,
    /// Directory entries (name to inode) added, removed or replaced since the directory was last
    /// synced, in directories reachable before the cut.
    pub entries_reverted: usize,
    /// Inodes no longer reachable from the root after the entries were reverted: never durably
    /// named, or unlinked durably.
    pub inodes_forgotten: usize,
}

/// Requests served since the mount.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Counters {
    /// `WRITE` requests.
    pub writes: u64,
    /// `FSYNC` requests (of files: `fsync(2)` and `fdatasync(2)`).
    pub fsyncs: u64,
    /// `FSYNCDIR` requests.
    pub fsyncdirs: u64,
    /// Requests by FUSE operation (`"write"`, `"getattr"`, `"flush"`...), for the operations
    /// implemented here (not `forget`, `opendir`, `release`, `releasedir`).
    pub ops: BTreeMap<String, u64>,
}

/// A value as reads see it now, and as it would be after a power cut.
#[derive(Clone, Default)]
struct Versioned<T> {
    current: T,
    durable: T,
}

impl<T: Clone> Versioned<T> {
    /// `fsync`: durable := current.
    fn sync(&mut self) {
        self.durable.clone_from(&self.current);
    }
    /// The cut: current := durable.
    fn revert(&mut self) {
        self.current.clone_from(&self.durable);
    }
}

/// A directory's entries: name to inode number.
type Entries = BTreeMap<OsString, u64>;

enum Body {
    File(Versioned<Vec<u8>>),
    Dir(Versioned<Entries>),
}

/// An inode: versioned contents, and metadata that is not versioned, kept in the attributes
/// the kernel is sent (their size and link count are computed from the contents).
struct Inode {
    body: Body,
    attr: FileAttr,
}

type Result<T, E = Errno> = std::result::Result<T, E>;

/// The whole filesystem, current and durable, and the requests served.
#[derive(Default)]
struct State {
    inodes: HashMap<u64, Inode>,
    next_ino: u64,
    ops: BTreeMap<&'static str, u64>,
    /// [`Options::fsync_keeps_names`].
    fsync_keeps_names: bool,
}

impl State {
    fn new(fsync_keeps_names: bool) -> Self {
        let mut state = State {
            next_ino: ROOT,
            fsync_keeps_names,
            ..State::default()
        };
        let (uid, gid) = (
            rustix::process::getuid().as_raw(),
            rustix::process::getgid().as_raw(),
        );
        state.new_inode(Body::Dir(Versioned::default()), 0o755, uid, gid);
        state
    }

    /// Numbers are never reused: the kernel cannot mistake a new inode for a forgotten one.
    fn new_inode(&mut self, body: Body, mode: u32, uid: u32, gid: u32) -> u64 {
        let (ino, now) = (self.next_ino, SystemTime::now());
        let kind = match body {
            Body::File(_) => FileType::RegularFile,
            Body::Dir(_) => FileType::Directory,
        };
        let attr = FileAttr {
            ino: INodeNo(ino),
            size: 0,
            blocks: 0,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            kind,
            perm: (mode & 0o7777) as u16,
            nlink: 0,
            uid,
            gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        };
        self.inodes.insert(ino, Inode { body, attr });
        self.next_ino += 1;
        ino
    }

    fn node(&mut self, ino: u64) -> Result<&mut Inode> {
        self.inodes.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    fn is_dir(&self, ino: u64) -> bool {
        matches!(self.inodes.get(&ino).map(|n| &n.body), Some(Body::Dir(_)))
    }

    /// A directory's current entries.
    fn entries(&mut self, dir: u64) -> Result<&mut Entries> {
        match &mut self.node(dir)?.body {
            Body::Dir(entries) => Ok(&mut entries.current),
            Body::File(_) => Err(Errno::ENOTDIR),
        }
    }

    /// A file's current bytes.
    fn data(&mut self, ino: u64) -> Result<&mut Vec<u8>> {
        match &mut self.node(ino)?.body {
            Body::File(data) => Ok(&mut data.current),
            Body::Dir(_) => Err(Errno::EISDIR),
        }
    }

    fn child(&mut self, dir: u64, name: &OsStr) -> Result<u64> {
        self.entries(dir)?.get(name).copied().ok_or(Errno::ENOENT)
    }

    /// Every directory's current entries.
    fn dirs(&self) -> impl Iterator<Item = (u64, &Entries)> {
        self.inodes
            .iter()
            .filter_map(|(&ino, node)| match &node.body {
                Body::Dir(d) => Some((ino, &d.current)),
                Body::File(_) => None,
            })
    }

    /// A directory's current entries with `.` and `..`, for `readdir`.
    fn listing(&mut self, dir: u64) -> Result<Vec<(OsString, u64, FileType)>> {
        let entries = self.entries(dir)?.clone();
        let mut parents = self.dirs().filter(|(_, e)| e.values().any(|&i| i == dir));
        let parent = parents.next().map_or(ROOT, |(p, _)| p);
        let all = [(".".into(), dir), ("..".into(), parent)]
            .into_iter()
            .chain(entries);
        let kind = |i| {
            self.inodes
                .get(&i)
                .map_or(FileType::RegularFile, |n| n.attr.kind)
        };
        Ok(all.map(|(name, i)| (name, i, kind(i))).collect())
    }

    /// Marks an inode modified (its data or its entries).
    fn touch(&mut self, ino: u64) {
        if let Ok(node) = self.node(ino) {
            let now = SystemTime::now();
            (node.attr.mtime, node.attr.ctime) = (now, now);
        }
    }

    fn attr(&self, ino: u64) -> Result<FileAttr> {
        let node = self.inodes.get(&ino).ok_or(Errno::ENOENT)?;
        let (size, nlink) = match &node.body {
            Body::File(data) => {
                let links = self
                    .dirs()
                    .map(|(_, e)| e.values().filter(|&&i| i == ino).count());
                (data.current.len(), links.sum())
            }
            Body::Dir(d) => {
                let subdirs = d.current.values().filter(|&&i| self.is_dir(i)).count();
                (d.current.len(), 2 + subdirs)
            }
        };
        let (size, nlink) = (size as u64, nlink as u32);
        Ok(FileAttr {
            size,
            blocks: size.div_ceil(512),
            nlink,
            ..node.attr
        })
    }

    /// Adds a new file or directory under `name` in `dir`'s current entries.
    fn add(&mut self, req: &Request, dir: u64, name: &OsStr, mode: u32, body: Body) -> Result<u64> {
        if self.entries(dir)?.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let ino = self.new_inode(body, mode, req.uid(), req.gid());
        self.entries(dir)?.insert(name.to_owned(), ino);
        self.touch(dir);
        Ok(ino)
    }

    /// `create`: a new file, or with neither `O_EXCL` nor a directory in the way, the existing
    /// one (truncated for `O_TRUNC`). The kernel looks the name up first and calls `create` only
    /// when it found nothing, so the existing case is a race with another process.
    fn create(
        &mut self,
        req: &Request,
        dir: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> Result<u64> {
        match self.child(dir, name) {
            Err(Errno::ENOENT) => self.add(req, dir, name, mode, Body::File(Versioned::default())),
            Err(e) => Err(e),
            Ok(_) if flags & libc::O_EXCL != 0 => Err(Errno::EEXIST),
            Ok(ino) => self.open(ino, flags).map(|()| ino),
        }
    }

    /// `open` of a file, truncating it for `O_TRUNC`. (For `open(2)` the kernel truncates with a
    /// `setattr` first, as fuser does not ask for `FUSE_ATOMIC_O_TRUNC`.)
    fn open(&mut self, ino: u64, flags: i32) -> Result<()> {
        let data = self.data(ino)?;
        if flags & libc::O_TRUNC != 0 && !data.is_empty() {
            data.clear();
            self.touch(ino);
        }
        Ok(())
    }

    fn write(&mut self, ino: u64, offset: u64, bytes: &[u8]) -> Result<u32> {
        let data = self.data(ino)?;
        let (start, end) = (offset as usize, offset as usize + bytes.len());
        if data.len() < end {
            data.resize(end, 0);
        }
        data[start..end].copy_from_slice(bytes);
        self.touch(ino);
        Ok(bytes.len() as u32)
    }

    /// `unlink` (`rmdir == false`) or `rmdir`. The inode stays until the next cut.
    fn remove(&mut self, dir: u64, name: &OsStr, rmdir: bool) -> Result<()> {
        let ino = self.child(dir, name)?;
        match (&self.node(ino)?.body, rmdir) {
            (Body::Dir(_), false) => return Err(Errno::EISDIR),
            (Body::File(_), true) => return Err(Errno::ENOTDIR),
            (Body::Dir(d), true) if !d.current.is_empty() => return Err(Errno::ENOTEMPTY),
            _ => {}
        }
        self.entries(dir)?.remove(name);
        self.touch(dir);
        Ok(())
    }

    /// `rename`, replacing the target if there is one (unless `noreplace`). The kernel has
    /// already refused moving a directory under itself.
    fn rename(
        &mut self,
        from: u64,
        name: &OsStr,
        to: u64,
        to_name: &OsStr,
        noreplace: bool,
    ) -> Result<()> {
        let ino = self.child(from, name)?;
        if let Some(&target) = self.entries(to)?.get(to_name) {
            match (self.is_dir(ino), &self.node(target)?.body) {
                _ if noreplace => return Err(Errno::EEXIST),
                _ if target == ino => return Ok(()), // onto itself: nothing to do
                (true, Body::File(_)) => return Err(Errno::ENOTDIR),
                (false, Body::Dir(_)) => return Err(Errno::EISDIR),
                (true, Body::Dir(d)) if !d.current.is_empty() => return Err(Errno::ENOTEMPTY),
                _ => {}
            }
        }
        self.entries(from)?.remove(name);
        self.entries(to)?.insert(to_name.to_owned(), ino);
        self.touch(from);
        self.touch(to);
        Ok(())
    }

    /// `fsync` of a file or `fsyncdir` of a directory: durable := current. With
    /// [`Options::fsync_keeps_names`], its names too (see [`State::keep_names`]).
    fn sync(&mut self, ino: u64) -> Result<()> {
        match &mut self.node(ino)?.body {
            Body::File(data) => data.sync(),
            Body::Dir(entries) => entries.sync(),
        }
        if self.fsync_keeps_names {
            self.keep_names(ino);
        }
        Ok(())
    }

    /// Makes `ino`'s names durable as they are now, and those of the directories on the way
    /// from the root to it: in every directory, the entries that name it now become durable,
    /// and its durable entries that name it under a name now gone (unlinked, or renamed away)
    /// are dropped. A durable entry of that name that a rename has since given to another
    /// inode is left as it is: that is the other inode's name to sync.
    fn keep_names(&mut self, ino: u64) {
        let (mut todo, mut done) = (vec![ino], HashSet::new());
        while let Some(child) = todo.pop() {
            if !done.insert(child) {
                continue;
            }
            for (&dir, node) in &mut self.inodes {
                let Body::Dir(d) = &mut node.body else {
                    continue;
                };
                let current = &d.current;
                d.durable
                    .retain(|name, &mut i| i != child || current.contains_key(name));
                let mut named = false;
                for (name, _) in d.current.iter().filter(|&(_, &i)| i == child) {
                    d.durable.insert(name.clone(), child);
                    named = true;
                }
                if named {
                    todo.push(dir);
                }
            }
        }
    }

    /// The power cut: see [`LossyMount::cut`].
    fn cut(&mut self) -> CutReport {
        let mut report = CutReport::default();
        // Only entries in directories reachable before the cut count as reverted.
        let before = self.reachable();
        for (ino, node) in &mut self.inodes {
            if let Body::Dir(d) = &mut node.body {
                if before.contains(ino) {
                    let changed = d
                        .current
                        .iter()
                        .filter(|&(n, i)| d.durable.get(n) != Some(i));
                    let gone = d.durable.keys().filter(|n| !d.current.contains_key(*n));
                    report.entries_reverted += changed.count() + gone.count();
                }
                d.revert();
            }
        }
        let (after, count) = (self.reachable(), self.inodes.len());
        self.inodes.retain(|ino, _| after.contains(ino));
        report.inodes_forgotten = count - self.inodes.len();
        for node in self.inodes.values_mut() {
            if let Body::File(f) = &mut node.body {
                let (now, then) = (&f.current, &f.durable);
                let common = now.len().min(then.len());
                let differ = (0..common).filter(|&i| now[i] != then[i]).count();
                let lost = differ + now.len().max(then.len()) - common;
                if lost > 0 {
                    report.files_reverted += 1;
                    report.bytes_dropped += lost as u64;
                }
                f.revert();
            }
        }
        report
    }

    /// Every inode reachable from the root through current entries.
    fn reachable(&self) -> HashSet<u64> {
        let (mut found, mut todo) = (HashSet::from([ROOT]), vec![ROOT]);
        while let Some(dir) = todo.pop() {
            if let Some(Body::Dir(d)) = self.inodes.get(&dir).map(|n| &n.body) {
                todo.extend(d.current.values().filter(|&&i| found.insert(i)));
            }
        }
        found
    }
}

fn reply_entry(reply: ReplyEntry, result: Result<FileAttr>) {
    match result {
        Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
        Err(e) => reply.error(e),
    }
}

fn reply_attr(reply: ReplyAttr, result: Result<FileAttr>) {
    match result {
        Ok(attr) => reply.attr(&TTL, &attr),
        Err(e) => reply.error(e),
    }
}

fn reply_empty(reply: ReplyEmpty, result: Result<()>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

/// The [`Filesystem`] fuser serves; [`serve`] keeps a second handle on the state.
struct LossyFs(Arc<Mutex<State>>);

impl LossyFs {
    /// The state, counting one request of kind `op`.
    fn lock(&self, op: &'static str) -> MutexGuard<'_, State> {
        let mut state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        *state.ops.entry(op).or_default() += 1;
        state
    }

    /// Counts a request that needs nothing from the state.
    fn count(&self, op: &'static str) {
        drop(self.lock(op));
    }
}

/// Unused arguments are `_`. `forget`, `opendir`, `release` and `releasedir` are fuser's
/// defaults, which reply OK and change nothing: a close makes nothing durable, and a `release` or
/// `forget` of an inode forgotten at a cut is harmless (inodes live until a cut makes them
/// unreachable, whatever the kernel remembers). Not implemented, so that the kernel does them
/// itself or refuses them: `getlk`/`setlk` (locks stay local), `link`, `mknod`, `symlink`,
/// `fallocate`, xattrs.
impl Filesystem for LossyFs {
    fn lookup(&self, _: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut st = self.lock("lookup");
        reply_entry(reply, st.child(parent.0, name).and_then(|ino| st.attr(ino)));
    }

    fn getattr(&self, _: &Request, ino: INodeNo, _: Option<FileHandle>, reply: ReplyAttr) {
        reply_attr(reply, self.lock("getattr").attr(ino.0));
    }

    fn setattr(
        &self,
        _: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _: Option<SystemTime>,
        _: Option<FileHandle>,
        _: Option<SystemTime>,
        _: Option<SystemTime>,
        _: Option<SystemTime>,
        _: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut st = self.lock("setattr");
        let mut set = || {
            if let Some(size) = size {
                st.data(ino.0)?.resize(size as usize, 0); // truncate or extend: not durable
                st.touch(ino.0);
            }
            let time = |t| match t {
                TimeOrNow::SpecificTime(t) => t,
                TimeOrNow::Now => SystemTime::now(),
            };
            let attr = &mut st.node(ino.0)?.attr;
            attr.perm = mode.map_or(attr.perm, |m| (m & 0o7777) as u16);
            attr.uid = uid.unwrap_or(attr.uid);
            attr.gid = gid.unwrap_or(attr.gid);
            attr.atime = atime.map_or(attr.atime, time);
            attr.mtime = mtime.map_or(attr.mtime, time);
            attr.ctime = SystemTime::now();
            st.attr(ino.0)
        };
        reply_attr(reply, set());
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let mut st = self.lock("mkdir");
        let dir = Body::Dir(Versioned::default());
        let ino = st.add(req, parent.0, name, mode & !umask, dir);
        reply_entry(reply, ino.and_then(|ino| st.attr(ino)));
    }

    fn unlink(&self, _: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.lock("unlink").remove(parent.0, name, false));
    }

    fn rmdir(&self, _: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.lock("rmdir").remove(parent.0, name, true));
    }

    fn rename(
        &self,
        _: &Request,
        parent: INodeNo,
        name: &OsStr,
        new_parent: INodeNo,
        new_name: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut st = self.lock("rename");
        let noreplace = flags == RenameFlags::RENAME_NOREPLACE;
        if !flags.is_empty() && !noreplace {
            return reply.error(Errno::EINVAL); // RENAME_EXCHANGE, RENAME_WHITEOUT
        }
        let (from, to) = (parent.0, new_parent.0);
        reply_empty(reply, st.rename(from, name, to, new_name, noreplace));
    }

    fn open(&self, _: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        // No FOPEN_KEEP_CACHE: the kernel drops its cached pages of the file on every open.
        match self.lock("open").open(ino.0, flags.0) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut st = self.lock("create");
        let ino = st.create(req, parent.0, name, mode & !umask, flags);
        match ino.and_then(|ino| st.attr(ino)) {
            Ok(attr) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(0),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _: &Request,
        ino: INodeNo,
        _: FileHandle,
        offset: u64,
        size: u32,
        _: OpenFlags,
        _: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.lock("read").data(ino.0) {
            Ok(data) => {
                let start = (offset as usize).min(data.len());
                let end = (start + size as usize).min(data.len());
                reply.data(&data[start..end]);
            }
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _: &Request,
        ino: INodeNo,
        _: FileHandle,
        offset: u64,
        data: &[u8],
        _: WriteFlags,
        _: OpenFlags,
        _: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.lock("write").write(ino.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _: &Request, _: INodeNo, _: FileHandle, _: LockOwner, reply: ReplyEmpty) {
        self.count("flush"); // close(2): makes nothing durable
        reply.ok();
    }

    fn fsync(&self, _: &Request, ino: INodeNo, _: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        reply_empty(reply, self.lock("fsync").sync(ino.0)); // fdatasync too
    }

    fn readdir(
        &self,
        _: &Request,
        ino: INodeNo,
        _: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let listing = match self.lock("readdir").listing(ino.0) {
            Ok(listing) => listing,
            Err(e) => return reply.error(e),
        };
        for (i, (name, child, kind)) in listing.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(child), i as u64 + 1, kind, name) {
                break; // buffer full: the kernel asks again from this offset
            }
        }
        reply.ok();
    }

    fn fsyncdir(&self, _: &Request, ino: INodeNo, _: FileHandle, _: bool, reply: ReplyEmpty) {
        reply_empty(reply, self.lock("fsyncdir").sync(ino.0));
    }

    fn statfs(&self, _: &Request, _: INodeNo, reply: ReplyStatfs) {
        self.count("statfs");
        let (blocks, files) = (1 << 24, 1 << 20); // 64 GiB in 4 KiB blocks, all free
        reply.statfs(blocks, blocks, blocks, files, files, 4096, 255, 4096);
    }

    fn access(&self, _: &Request, ino: INodeNo, _: AccessFlags, reply: ReplyEmpty) {
        // No permission checks: tests run as one user, or trust every user (`Options::all_users`).
        reply_empty(reply, self.lock("access").node(ino.0).map(|_| ()));
    }
}

/// Set (to the mount point) in the environment of the test binary started as the server.
pub const SERVE_ENV: &str = "SEKALI_LOSSYFS_SERVE";

/// Set (to `1`) beside [`SERVE_ENV`] by [`LossyMount::new_for_all`]: the server then mounts for
/// every user (`allow_other`, fuser's [`SessionACL::All`]), not only for its owner and root.
pub const ALL_USERS_ENV: &str = "SEKALI_LOSSYFS_ALL_USERS";

/// Set (to `1`) beside [`SERVE_ENV`] for [`Options::fsync_keeps_names`].
pub const FSYNC_KEEPS_NAMES_ENV: &str = "SEKALI_LOSSYFS_FSYNC_KEEPS_NAMES";

/// How [`LossyMount::with`] mounts; the default is [`LossyMount::new`]'s.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Every user may use the mount, not only this process's user and root (see [`serve`]):
    /// for a server that runs as a user of its own, such as PostgreSQL.
    pub all_users: bool,
    /// An `fsync` of a file or directory also makes durable the names that lead to it from the
    /// root, as Linux's filesystems do and POSIX does not promise (see the module
    /// documentation). Off, only `fsync` of a directory makes names durable, its entries'.
    pub fsync_keeps_names: bool,
}

/// The server process: mounts an empty [`LossyFs`] on `mount_point`, says `ready` on standard
/// output, then answers one line per request read from standard input (`cut`: the
/// [`CutReport`], `counters`: the [`Counters`], as JSON) until standard input closes, which is
/// when the test drops its [`LossyMount`] or dies. It then detaches the mount lazily and goes on
/// serving the files still open on it until the last is closed and the kernel lets go.
///
/// It mounts with `auto_unmount` first: `fusermount3` then waits beside this process and
/// unmounts if it dies (`SIGKILL`, abort) instead of leaving a dead mount ("Transport endpoint
/// is not connected") behind. fuser allows that only with `allow_other`, and then serves the
/// owner and root only. Without `fusermount3`, it mounts directly (as root), without
/// `auto_unmount`.
///
/// With [`ALL_USERS_ENV`] set, it serves every user, both ways (`allow_other`, which root may
/// ask for without `user_allow_other` in `/etc/fuse.conf`): for a server such as PostgreSQL that
/// runs as a user of its own. The filesystem checks no permissions (see `access`), and the kernel
/// checks none either (no `default_permissions`), so such a user can do anything on it.
pub fn serve(mount_point: &Path) -> io::Result<()> {
    let fsync_keeps_names = std::env::var_os(FSYNC_KEEPS_NAMES_ENV).is_some();
    let state = Arc::new(Mutex::new(State::new(fsync_keeps_names)));
    let all_users = std::env::var_os(ALL_USERS_ENV).is_some();
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("sekali-lossyfs".into()),
        MountOption::Subtype("lossyfs".into()),
    ];
    if all_users {
        config.acl = SessionACL::All;
    }
    let mut auto_unmount = config.clone();
    auto_unmount.mount_options.push(MountOption::AutoUnmount);
    auto_unmount.acl = if all_users {
        SessionACL::All
    } else {
        SessionACL::RootAndOwner
    };
    let session = fuser::spawn_mount(LossyFs(state.clone()), mount_point, &auto_unmount)
        .or_else(|_| fuser::spawn_mount(LossyFs(state.clone()), mount_point, &config))?;
    let lock = || state.lock().unwrap_or_else(PoisonError::into_inner);
    let mut out = io::stdout().lock();
    writeln!(out, "ready")?;
    out.flush()?;
    for request in io::stdin().lock().lines() {
        let answer = match request?.as_str() {
            "cut" => serde_json::to_string(&lock().cut()),
            "counters" => {
                let ops: BTreeMap<String, u64> = lock()
                    .ops
                    .iter()
                    .map(|(op, n)| (op.to_string(), *n))
                    .collect();
                let count = |op| ops.get(op).copied().unwrap_or(0);
                serde_json::to_string(&Counters {
                    writes: count("write"),
                    fsyncs: count("fsync"),
                    fsyncdirs: count("fsyncdir"),
                    ops,
                })
            }
            other => panic!("lossyfs: an unknown request: {other:?}"),
        };
        writeln!(out, "{}", answer.expect("a report serializes"))?;
        out.flush()?;
    }
    // The test is done with the mount. Detached lazily, it leaves /proc/mounts at once, and the
    // session thread ends once the last file on it is closed.
    detach(mount_point);
    session.join()
}

/// Detaches the mount at `path` lazily: directly as root, through `fusermount3` otherwise.
fn detach(path: &Path) {
    if rustix::mount::unmount(path, rustix::mount::UnmountFlags::DETACH).is_err() {
        let _ = Command::new("fusermount3").arg("-uz").arg(path).status();
    }
}

/// A [`LossyFs`] mounted on a fresh temporary directory, served by a child process (see the
/// module's documentation).
///
/// Dropping it unmounts the filesystem (also when a test panics: unwinding drops it) and
/// removes the directory. Declare it before the files and connections that use it, so that
/// they are closed first; if something still has a file open on it, the mount is detached
/// lazily (`MNT_DETACH`) and that file goes on being served until it is closed.
pub struct LossyMount {
    server: Child,
    /// The server's input and output; closing its input tells the server to unmount.
    channel: Mutex<Option<(ChildStdin, io::BufReader<ChildStdout>)>>,
    /// The mount point, canonical, as `/proc/mounts` shows it.
    path: PathBuf,
    /// Removed after the unmount (fields drop after `Drop::drop`).
    _dir: tempfile::TempDir,
}

impl LossyMount {
    /// Mounts an empty filesystem named `sekali-lossyfs` (type `fuse.lossyfs`), served by a
    /// child process (see [`serve`]). Needs `/dev/fuse`, and root or the `fusermount3` helper
    /// (Debian's `fuse3`).
    pub fn new() -> io::Result<Self> {
        Self::with(Options::default())
    }

    /// Like [`new`](Self::new), but every user may use the mount, not only this process's user
    /// and root (see [`serve`]): for PostgreSQL, which runs as the `postgres` user. The mount's
    /// root is owned by this process's user, mode 0755; `chown` it for another.
    pub fn new_for_all() -> io::Result<Self> {
        Self::with(Options {
            all_users: true,
            ..Options::default()
        })
    }

    /// Like [`new`](Self::new), with `options`.
    pub fn with(options: Options) -> io::Result<Self> {
        let dir = tempfile::Builder::new().prefix("lossyfs-").tempdir()?;
        let path = dir.path().canonicalize()?;
        let mut command = Command::new(std::env::current_exe()?);
        command.env(SERVE_ENV, &path);
        for (set, name) in [
            (options.all_users, ALL_USERS_ENV),
            (options.fsync_keeps_names, FSYNC_KEEPS_NAMES_ENV),
        ] {
            if set {
                command.env(name, "1");
            } else {
                command.env_remove(name);
            }
        }
        let mut server = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let requests = server.stdin.take().expect("piped");
        let mut answers = io::BufReader::new(server.stdout.take().expect("piped"));
        let mut ready = String::new();
        answers.read_line(&mut ready)?;
        if ready.trim_end() != "ready" {
            let _ = server.kill();
            let _ = server.wait();
            return Err(io::Error::other(format!(
                "the lossyfs server did not mount {} (its error is above)",
                path.display()
            )));
        }
        Ok(LossyMount {
            server,
            channel: Mutex::new(Some((requests, answers))),
            path,
            _dir: dir,
        })
    }

    /// Where the filesystem is mounted.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The power cut. Every directory's current entries become its durable entries, the inodes
    /// no longer reachable from the root are forgotten, and every remaining file's current bytes
    /// become its durable bytes. Call it only once every process using the mount is dead (or,
    /// in-process, every file on it is closed): see the module documentation.
    pub fn cut(&self) -> CutReport {
        self.ask("cut")
    }

    /// Requests served so far.
    pub fn counters(&self) -> Counters {
        self.ask("counters")
    }

    fn ask<T: serde::de::DeserializeOwned>(&self, request: &str) -> T {
        let mut channel = self.channel.lock().unwrap_or_else(PoisonError::into_inner);
        let (requests, answers) = channel.as_mut().expect("open until the drop");
        writeln!(requests, "{request}").expect("the lossyfs server takes requests");
        requests.flush().expect("the lossyfs server takes requests");
        let mut answer = String::new();
        answers
            .read_line(&mut answer)
            .expect("the lossyfs server answers");
        serde_json::from_str(&answer)
            .unwrap_or_else(|e| panic!("the lossyfs server's answer {answer:?}: {e}"))
    }
}

impl Drop for LossyMount {
    fn drop(&mut self) {
        // Closing its input tells the server to detach the mount. It lives on while files on
        // the detached mount are open, serving them; it is reaped here if it has ended by the
        // time the mount is gone, and otherwise (a file still open) by nobody: it exits when that
        // file is closed, and is cleared up with this process.
        drop(
            self.channel
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        let start = Instant::now();
        while is_mounted(&self.path) && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        if is_mounted(&self.path) {
            detach(&self.path);
        }
        let unmounted = Instant::now();
        while unmounted.elapsed() < Duration::from_millis(500) {
            if let Ok(Some(_)) = self.server.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Whether `/proc/mounts` lists a mount on `path`.
pub fn is_mounted(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts.lines().any(|l| l.split(' ').nth(1) == path.to_str())
}
