//! A thin SQLite VFS over the platform's default one that merges the WAL writes of a commit into
//! one `pwrite`.
//!
//! SQLite writes each WAL frame with two calls: its 24-byte header, then the page. A batch of
//! about 27 deliveries commits about 45 frames, so about 90 `pwrite`s, each straddling OS pages
//! (a frame is 4,120 bytes). This VFS passes every file straight to the default VFS except the
//! WAL, whose writes it collects while they are contiguous and hands on in a few large calls before
//! anything that must see them: `xSync` (the COMMIT's fsync), `xRead`, `xFileSize`,
//! `xTruncate`, `xFileControl` and `xClose`. Measured with a C loop on this kind of machine, 45
//! frames written as 90 `pwrite`s and fsynced cost 128 µs of CPU; as one `pwrite`, 65 µs.
//! (The unix VFS takes at most 128 KiB per call, so a typical commit of about 185 KB is two.)
//!
//! Correct only when every commit syncs the WAL: other connections read committed frames
//! through their own file descriptors, so a frame must be in the file by the time the commit
//! is published. With `synchronous=FULL` SQLite syncs the WAL at every commit, before it
//! publishes the commit in the wal-index; [`open`] refuses any other setting. A crash loses at
//! most the buffered frames of a transaction that had not committed, which SQLite's recovery
//! ignores anyway.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::size_of;
use std::path::Path;
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::OnceLock;

use rusqlite::ffi;
use rusqlite::{Connection, OpenFlags};

/// The name the VFS is registered under.
pub const NAME: &CStr = c"sekali-wal-coalescing";

/// A write run longer than this is handed on at once rather than collected further.
const MAX_BUFFERED: usize = 512 * 1024;

/// The most the unix VFS writes in one call: it masks each write's length to 17 bits (SQLite
/// itself never writes more than a page at a time), so longer runs go in pieces of this size.
const MAX_WRITE: usize = 124 * 1024;

/// Opens `path` for writing through this VFS, registering it first if needed. The caller must
/// then set `synchronous=FULL`; [`check_full_sync`] verifies it.
pub fn open(path: &Path) -> rusqlite::Result<Connection> {
    register()?;
    Connection::open_with_flags_and_vfs(path, OpenFlags::default(), NAME)
}

/// Refuses a connection through this VFS whose commits do not sync the WAL (see the module
/// docs): a commit would then be published before its frames are in the file.
pub fn check_full_sync(conn: &Connection) -> rusqlite::Result<()> {
    let level: i64 = conn.pragma_query_value(None, "synchronous", |row| row.get(0))?;
    if level >= 2 {
        Ok(())
    } else {
        Err(rusqlite::Error::SqliteFailure(
            ffi::Error::new(ffi::SQLITE_MISUSE),
            Some(format!(
                "the WAL-coalescing VFS needs synchronous=FULL or EXTRA, not level {level}"
            )),
        ))
    }
}

/// The default VFS this one wraps (set once, by [`register`]).
static INNER: AtomicPtr<ffi::sqlite3_vfs> = AtomicPtr::new(ptr::null_mut());

fn register() -> rusqlite::Result<()> {
    static REGISTERED: OnceLock<c_int> = OnceLock::new();
    let rc = *REGISTERED.get_or_init(|| {
        // SAFETY: sqlite3_vfs_find and sqlite3_vfs_register are thread-safe in SQLite's
        // serialized build (libsqlite3-sys compiles with SQLITE_THREADSAFE=1). The copied
        // struct is leaked, so it outlives every connection that uses it, as SQLite requires.
        unsafe {
            let inner = ffi::sqlite3_vfs_find(ptr::null());
            if inner.is_null() {
                return ffi::SQLITE_ERROR;
            }
            INNER.store(inner, Ordering::Release);
            // Every method but xOpen is the default VFS's own. They take the VFS pointer, but
            // read at most pAppData from it, which the copy keeps.
            let mut vfs: ffi::sqlite3_vfs = ptr::read(inner);
            vfs.szOsFile = (size_of::<WalFile>() + (*inner).szOsFile as usize) as c_int;
            vfs.pNext = ptr::null_mut();
            vfs.zName = NAME.as_ptr();
            vfs.xOpen = Some(x_open);
            ffi::sqlite3_vfs_register(Box::leak(Box::new(vfs)), 0)
        }
    });
    if rc == ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(rusqlite::Error::SqliteFailure(
            ffi::Error::new(rc),
            Some("registering the WAL-coalescing VFS failed".into()),
        ))
    }
}

/// What SQLite holds for a WAL file opened through this VFS. The default VFS's own file
/// follows it in the same allocation (`szOsFile` covers both).
#[repr(C)]
struct WalFile {
    base: ffi::sqlite3_file,
    inner: *mut ffi::sqlite3_file,
    /// Bytes written but not yet handed on, for the file range starting at `start`.
    pending: Vec<u8>,
    start: i64,
}

static WAL_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 1,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_unlock),
    xCheckReservedLock: Some(x_check_reserved_lock),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device_characteristics),
    xShmMap: None,
    xShmLock: None,
    xShmBarrier: None,
    xShmUnmap: None,
    xFetch: None,
    xUnfetch: None,
};

unsafe extern "C" fn x_open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let inner_vfs = INNER.load(Ordering::Acquire);
    let inner_open = (*inner_vfs).xOpen.expect("a VFS has xOpen");
    if flags & ffi::SQLITE_OPEN_WAL == 0 {
        // Not the WAL: the whole slot is the default VFS's file, with its own methods.
        return inner_open(inner_vfs, name, file, flags, out_flags);
    }
    (*file).pMethods = ptr::null();
    let inner = file
        .cast::<u8>()
        .add(size_of::<WalFile>())
        .cast::<ffi::sqlite3_file>();
    let rc = inner_open(inner_vfs, name, inner, flags, out_flags);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    ptr::write(
        file.cast::<WalFile>(),
        WalFile {
            base: ffi::sqlite3_file {
                pMethods: &WAL_METHODS,
            },
            inner,
            pending: Vec::new(),
            start: 0,
        },
    );
    ffi::SQLITE_OK
}

/// The WalFile behind `file`.
///
/// # Safety
/// `file` must have been opened by [`x_open`] as a WAL file (it has `WAL_METHODS`), and SQLite
/// must not be using it from another thread (it never does: one connection, one thread).
unsafe fn wal<'a>(file: *mut ffi::sqlite3_file) -> &'a mut WalFile {
    &mut *file.cast::<WalFile>()
}

unsafe fn inner_methods(wal: &WalFile) -> &ffi::sqlite3_io_methods {
    &*(*wal.inner).pMethods
}

/// Hands the collected bytes on, in as few writes as the default VFS takes. They are dropped
/// even if a write fails: SQLite then fails the transaction, and the frames mean nothing.
unsafe fn flush(wal: &mut WalFile) -> c_int {
    let write = inner_methods(wal).xWrite.expect("a file has xWrite");
    let mut rc = ffi::SQLITE_OK;
    let mut offset = wal.start;
    for chunk in wal.pending.chunks(MAX_WRITE) {
        rc = write(
            wal.inner,
            chunk.as_ptr().cast::<c_void>(),
            chunk.len() as c_int,
            offset,
        );
        if rc != ffi::SQLITE_OK {
            break;
        }
        offset += chunk.len() as i64;
    }
    wal.pending.clear();
    rc
}

unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
    let wal = wal(file);
    let flushed = flush(wal);
    let close = inner_methods(wal).xClose.expect("a file has xClose");
    let closed = close(wal.inner);
    ptr::drop_in_place(&mut wal.pending);
    if flushed != ffi::SQLITE_OK {
        flushed
    } else {
        closed
    }
}

unsafe extern "C" fn x_read(
    file: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    let wal = wal(file);
    let rc = flush(wal);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    (inner_methods(wal).xRead.expect("a file has xRead"))(wal.inner, buf, amount, offset)
}

unsafe extern "C" fn x_write(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    let wal = wal(file);
    let data = std::slice::from_raw_parts(data.cast::<u8>(), amount as usize);
    let end = wal.start + wal.pending.len() as i64;
    if !wal.pending.is_empty() && offset >= wal.start && offset + i64::from(amount) <= end {
        // Rewrites bytes still collected (SQLite rewrites frames of the open transaction).
        let at = (offset - wal.start) as usize;
        wal.pending[at..at + data.len()].copy_from_slice(data);
        return ffi::SQLITE_OK;
    }
    if wal.pending.is_empty() || offset != end {
        let rc = flush(wal);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        wal.start = offset;
    }
    wal.pending.extend_from_slice(data);
    if wal.pending.len() >= MAX_BUFFERED {
        return flush(wal);
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_truncate(file: *mut ffi::sqlite3_file, size: i64) -> c_int {
    let wal = wal(file);
    let rc = flush(wal);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    (inner_methods(wal).xTruncate.expect("a file has xTruncate"))(wal.inner, size)
}

unsafe extern "C" fn x_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    let wal = wal(file);
    let rc = flush(wal);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    (inner_methods(wal).xSync.expect("a file has xSync"))(wal.inner, flags)
}

unsafe extern "C" fn x_file_size(file: *mut ffi::sqlite3_file, size: *mut i64) -> c_int {
    let wal = wal(file);
    let rc = flush(wal);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    (inner_methods(wal).xFileSize.expect("a file has xFileSize"))(wal.inner, size)
}

unsafe extern "C" fn x_lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    let wal = wal(file);
    (inner_methods(wal).xLock.expect("a file has xLock"))(wal.inner, level)
}

unsafe extern "C" fn x_unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    let wal = wal(file);
    (inner_methods(wal).xUnlock.expect("a file has xUnlock"))(wal.inner, level)
}

unsafe extern "C" fn x_check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    let wal = wal(file);
    (inner_methods(wal)
        .xCheckReservedLock
        .expect("a file has xCheckReservedLock"))(wal.inner, out)
}

unsafe extern "C" fn x_file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    let wal = wal(file);
    let rc = flush(wal);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    (inner_methods(wal)
        .xFileControl
        .expect("a file has xFileControl"))(wal.inner, op, arg)
}

unsafe extern "C" fn x_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    let wal = wal(file);
    (inner_methods(wal)
        .xSectorSize
        .expect("a file has xSectorSize"))(wal.inner)
}

unsafe extern "C" fn x_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    let wal = wal(file);
    (inner_methods(wal)
        .xDeviceCharacteristics
        .expect("a file has xDeviceCharacteristics"))(wal.inner)
}
