//! The mail directory: each email one `<key>.eml` file, on the disk before its row is `sent`.
//!
//! [`write_eml_batch`] writes a batch in two steps. First every email goes into a file that has
//! no name yet (`O_TMPFILE`), and their data is synced (see [`DirSync`]); then each gets its
//! name (`linkat`), and the directory is synced, so that the names are durable too. A reader
//! never sees half an email, and after a power cut a `.eml` file is whole or absent. One
//! barrier of each kind per batch, not per file. (Measured draining 200,000 rows, for a batch
//! of 4,096: 45 ms writing, 45 ms syncing, 76 ms naming and syncing the directory.)
//!
//! Why unnamed files: a name is a directory entry, and in a directory of 200,000 emails the
//! entries cost more than the data. An unnamed file gets one entry; a temporary name costs three
//! (its creation, and the rename's removal and insertion). On a file system without `O_TMPFILE`
//! (FUSE, NFS) each email is written under a temporary name and renamed into place instead.
//!
//! A name that exists already is an email written whole before (the relay sends a row again
//! when a crash lost its result): names are only ever given to synced data.
//!
//! Every email of a batch keeps its file open from its write to its name, so a batch may hold
//! no more emails than the process may open files: see [`files_per_batch`].

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

/// Why an email (or a whole batch) was not written: what was being done, in which directory,
/// and the system's error. Always worth another try.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{what} in the mail directory {dir}: {error}")]
pub struct WriteError {
    what: &'static str,
    dir: String,
    error: String,
}

/// How the file transport makes a batch of emails durable before their rows are `sent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirSync {
    /// One `syncfs(2)` for the whole batch: on a local journaling file system (ext4, XFS,
    /// Btrfs, F2FS, ZFS; tmpfs and overlayfs pass it on), it writes every file's data out, as an
    /// fsync each would, for the price of one. Measured on this kind of machine with 3 KB files:
    /// about 35,000 files/s, against about 3,500/s with an fsync each.
    FileSystem,
    /// An fsync of each file: on any other file system (FUSE, NFS and the like), where syncfs
    /// may not reach the server and promises nothing.
    EachFile,
}

impl DirSync {
    /// The cheapest sync that is a full barrier on the file system `dir` is on.
    pub fn for_dir(dir: &Path) -> DirSync {
        // statfs(2) f_type magic numbers of the file systems whose syncfs is a barrier.
        const FULL_BARRIER: [u64; 8] = [
            0xEF53,      // ext2, ext3, ext4
            0x5846_5342, // XFS
            0x9123_683E, // Btrfs
            0xF2F5_2010, // F2FS
            0x2FC1_2FC1, // ZFS
            0x0102_1994, // tmpfs (nothing is durable; nothing to lose either)
            0x794C_7630, // overlayfs (syncs its upper file system)
            0x8584_58F6, // ramfs (as tmpfs)
        ];
        let kind = std::fs::File::open(dir)
            .ok()
            .and_then(|d| rustix::fs::fstatfs(&d).ok())
            .map(|s| s.f_type as u64);
        match kind {
            Some(kind) if FULL_BARRIER.contains(&kind) => DirSync::FileSystem,
            _ => DirSync::EachFile,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DirSync::FileSystem => "one syncfs per batch",
            DirSync::EachFile => "an fsync per file",
        }
    }

    /// How a batch's emails get their names on such a file system. The file systems whose
    /// syncfs is a barrier are the local ones, which have `O_TMPFILE`; the others (FUSE, NFS)
    /// would refuse it for every batch.
    fn naming(self) -> Naming {
        match self {
            DirSync::FileSystem => Naming::Unnamed,
            DirSync::EachFile => Naming::Temporary,
        }
    }
}

/// The most emails one batch may carry: a quarter of the open files this process may have (two
/// batches are in flight at once, each holding a file per email until it is named; the other
/// half is left for connections and the database). Read when the transport is made, after
/// [`crate::open_files::raise_limit`].
pub fn files_per_batch() -> usize {
    let limit = crate::open_files::soft_limit();
    usize::try_from(limit / 4).unwrap_or(usize::MAX).max(1)
}

/// Writes `files` (`(key, message)`) as `<dir>/<key>.eml`, and returns only once they are on
/// the disk, not merely in the page cache: the relay marks a row `sent` on this `Ok`, and a
/// power cut must not take back an email the database says was sent. Both steps, in order.
pub fn write_eml_batch(
    dir: &Path,
    files: &[(String, Vec<u8>)],
    sync: DirSync,
) -> Vec<Result<(), WriteError>> {
    match Unnamed::write(dir, files, sync) {
        Ok(batch) => batch.name(),
        Err(error) => files.iter().map(|_| Err(error.clone())).collect(),
    }
}

/// How an email gets its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Naming {
    /// An unnamed file, linked into place; a temporary name where the file system has none.
    Unnamed,
    /// The same, linked through its link in /proc, as on a kernel before 6.10 (which the
    /// tests take directly).
    #[cfg_attr(not(test), allow(dead_code))]
    UnnamedThroughProc,
    /// A temporary name, renamed into place (what a file system without `O_TMPFILE` gets).
    Temporary,
}

/// Where an email's synced data waits for its name.
enum Written {
    Unnamed(std::fs::File),
    Named(std::fs::File),
}

/// A batch of emails written and synced, waiting for their names: the first of the two steps
/// (see the module's documentation).
struct Unnamed {
    dir: PathBuf,
    dir_fd: OwnedFd,
    naming: Naming,
    /// Each email's key and its data, or why it could not be written.
    emails: Vec<(String, Result<Written, WriteError>)>,
}

fn io_error(dir: &Path, what: &'static str, e: std::io::Error) -> WriteError {
    WriteError {
        what,
        dir: dir.display().to_string(),
        error: e.to_string(),
    }
}

fn tmp_name(key: &str) -> String {
    format!(".{key}.eml.tmp")
}

impl Unnamed {
    /// Writes each email into a file of its own and syncs their data. `Err`: nothing of the
    /// batch is on the disk (the directory could not be made or opened, or the sync failed).
    fn write(
        dir: &Path,
        files: &[(String, Vec<u8>)],
        sync: DirSync,
    ) -> Result<Unnamed, WriteError> {
        Self::write_as(dir, files, sync, sync.naming())
    }

    fn write_as(
        dir: &Path,
        files: &[(String, Vec<u8>)],
        sync: DirSync,
        naming: Naming,
    ) -> Result<Unnamed, WriteError> {
        use std::io::Write;

        crate::durable::create_dir_all(dir).map_err(|e| io_error(dir, "creating it", e))?;
        let dir_fd = rustix::fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_error(dir, "opening it", e.into()))?;
        let file_mode = Mode::from_raw_mode(0o666);
        let mut unnamed_supported = naming != Naming::Temporary;
        let mut emails = Vec::with_capacity(files.len());
        for (key, bytes) in files {
            let mut write = || -> std::io::Result<Written> {
                let state = match unnamed_supported
                    .then(|| {
                        rustix::fs::openat(
                            &dir_fd,
                            ".",
                            OFlags::WRONLY | OFlags::TMPFILE | OFlags::CLOEXEC,
                            file_mode,
                        )
                    })
                    .transpose()
                {
                    Ok(Some(fd)) => Written::Unnamed(std::fs::File::from(fd)),
                    Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL) | Ok(None) => {
                        unnamed_supported = false;
                        let fd = rustix::fs::openat(
                            &dir_fd,
                            tmp_name(key),
                            OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::CLOEXEC,
                            file_mode,
                        )?;
                        Written::Named(std::fs::File::from(fd))
                    }
                    Err(e) => return Err(e.into()),
                };
                let (Written::Unnamed(file) | Written::Named(file)) = &state;
                let mut file: &std::fs::File = file;
                file.write_all(bytes)?;
                if sync == DirSync::EachFile {
                    file.sync_data()?;
                }
                Ok(state)
            };
            let written = write().map_err(|e| io_error(dir, "writing", e));
            emails.push((key.clone(), written));
        }
        if sync == DirSync::FileSystem && emails.iter().any(|(_, w)| w.is_ok()) {
            rustix::fs::syncfs(&dir_fd).map_err(|e| io_error(dir, "syncing", e.into()))?;
        }
        Ok(Unnamed {
            dir: dir.to_owned(),
            dir_fd,
            naming,
            emails,
        })
    }

    /// Gives each written email its name, then syncs the directory; the results are in the
    /// order of the batch.
    fn name(self) -> Vec<Result<(), WriteError>> {
        let Unnamed {
            dir,
            dir_fd,
            naming,
            emails,
        } = self;
        let io = |what: &'static str, e: std::io::Error| io_error(&dir, what, e);
        let mut empty_path = naming == Naming::Unnamed;
        let results: Vec<Result<(), WriteError>> = emails
            .into_iter()
            .map(|(key, written)| {
                let name = format!("{key}.eml");
                match written? {
                    Written::Named(_) => {
                        rustix::fs::renameat(&dir_fd, tmp_name(&key), &dir_fd, &name)
                            .map_err(|e| io("renaming", e.into()))
                    }
                    Written::Unnamed(file) => {
                        // The file itself (AT_EMPTY_PATH): Linux 6.10 and later let the process
                        // that opened it do that; before, it takes a privilege, and fails with
                        // ENOENT without it. Then the file's own link in /proc names it instead
                        // (a third slower, measured here).
                        let by_descriptor = empty_path.then(|| {
                            rustix::fs::linkat(&file, "", &dir_fd, &name, AtFlags::EMPTY_PATH)
                        });
                        let linked = match by_descriptor {
                            Some(Err(Errno::NOENT | Errno::PERM | Errno::INVAL)) | None => {
                                empty_path = false;
                                let own = format!("/proc/self/fd/{}", file.as_raw_fd());
                                rustix::fs::linkat(
                                    rustix::fs::CWD,
                                    own,
                                    &dir_fd,
                                    &name,
                                    AtFlags::SYMLINK_FOLLOW,
                                )
                            }
                            Some(result) => result,
                        };
                        match linked {
                            Ok(()) | Err(Errno::EXIST) => Ok(()),
                            Err(e) => Err(io("naming", e.into())),
                        }
                    }
                }
            })
            .collect();
        if results.iter().any(Result::is_ok) {
            // The names are entries of the directory: its own fsync makes them durable.
            if let Err(e) = rustix::fs::fsync(&dir_fd) {
                let error = io("syncing the directory", e.into());
                return results.iter().map(|_| Err(error.clone())).collect();
            }
        }
        results
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::{DirSync, Naming, Unnamed};

    fn batch() -> Vec<(String, Vec<u8>)> {
        (0..5)
            .map(|i| (format!("key{i}"), format!("email {i}\r\n").into_bytes()))
            .collect()
    }

    /// The names in `dir`, sorted.
    pub(in crate::mail) fn names(dir: &std::path::Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    fn write(
        dir: &std::path::Path,
        files: &[(String, Vec<u8>)],
        sync: DirSync,
        naming: Naming,
    ) -> Vec<Result<(), super::WriteError>> {
        Unnamed::write_as(dir, files, sync, naming).unwrap().name()
    }

    /// Both ways of naming leave exactly one whole file per email and nothing else: no
    /// temporary name, no unnamed file left behind.
    #[test]
    fn each_email_is_one_whole_file_under_its_own_name_whichever_way_it_is_named() {
        for naming in [
            Naming::Unnamed,
            Naming::UnnamedThroughProc,
            Naming::Temporary,
        ] {
            for sync in [DirSync::FileSystem, DirSync::EachFile] {
                let dir = tempfile::tempdir().unwrap();
                let mail = dir.path().join("mail");
                let results = write(&mail, &batch(), sync, naming);
                assert!(
                    results.iter().all(Result::is_ok),
                    "{naming:?} {sync:?}: {results:?}"
                );
                assert_eq!(
                    names(&mail),
                    (0..5).map(|i| format!("key{i}.eml")).collect::<Vec<_>>(),
                    "{naming:?} {sync:?}"
                );
                for i in 0..5 {
                    let text = std::fs::read_to_string(mail.join(format!("key{i}.eml"))).unwrap();
                    assert_eq!(text, format!("email {i}\r\n"));
                }
            }
        }
    }

    /// Between the two steps an unnamed email is in no directory: a reader of the mail
    /// directory sees nothing of a batch until it is named.
    #[test]
    fn a_written_batch_is_invisible_until_it_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let mail = dir.path().join("mail");
        let written = Unnamed::write(&mail, &batch(), DirSync::FileSystem).unwrap();
        assert_eq!(names(&mail), Vec::<String>::new());
        assert!(written.name().iter().all(Result::is_ok));
        assert_eq!(names(&mail).len(), 5);
    }

    /// A resend after a crash finds its email written: an unnamed file's name exists only once
    /// its data was synced, so the file there is whole and is kept.
    #[test]
    fn an_email_whose_name_exists_already_counts_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let mail = dir.path().join("mail");
        assert!(write(&mail, &batch(), DirSync::FileSystem, Naming::Unnamed)
            .iter()
            .all(Result::is_ok));
        let again: Vec<(String, Vec<u8>)> = batch()
            .into_iter()
            .map(|(key, _)| (key, b"sent again".to_vec()))
            .collect();
        let results = write(&mail, &again, DirSync::FileSystem, Naming::Unnamed);
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert_eq!(names(&mail).len(), 5);
        assert_eq!(
            std::fs::read_to_string(mail.join("key0.eml")).unwrap(),
            "email 0\r\n"
        );
    }
}
