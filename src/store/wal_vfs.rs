//! A thin SQLite VFS over the platform's default one that merges the WAL writes of a commit into
//! a few large `pwrite`s.
//!
//! SQLite writes each WAL frame with two calls: its 24-byte header, then the page. A batch of
//! about 27 deliveries commits about 45 frames, so about 90 `pwrite`s, each straddling OS pages
//! (a frame is 4,120 bytes). Measured with a C loop on this kind of machine, 45 frames written
//! as 90 `pwrite`s and fsynced cost 128 µs of CPU; as one `pwrite`, 65 µs. (The unix VFS takes
//! at most 128 KiB per call, so a typical commit of about 185 KB is two.)
//!
//! What it does:
//! - Every file but the main database and its WAL passes straight to the default VFS.
//! - The WAL's contiguous writes are collected and handed on before anything that must see
//!   them: `xSync` (the COMMIT's fsync), `xRead`, `xFileSize`, `xTruncate` and `xFileControl`.
//! - The main database file is wrapped only to watch its shared-memory locks: before the
//!   connection releases the WAL write lock, whatever is still collected is handed on too.
//!
//! Why that is safe:
//! - A commit is published to other connections (in the wal-index) only after its `xSync`,
//!   and `synchronous=FULL` syncs the WAL at every commit: so every committed frame is in the
//!   file before anyone can look for it. [`check_full_sync`] refuses any other setting.
//! - Bytes still collected when the write lock is about to be released belong to a transaction
//!   that did not commit: frames SQLite wrote early because its page cache was full, then
//!   rolled back. Handing them on after the release could overwrite frames that another
//!   connection has since committed at the same offsets. So they are handed on while the lock
//!   is still held, beyond the last commit, where nothing reads them: the file ends up exactly
//!   as stock SQLite leaves it. The same happens on the first shared-memory lock call after a
//!   spell of `locking_mode=EXCLUSIVE`, which takes no such locks.
//! - A collected write that fails to reach the file fails every later write and sync of the
//!   transaction, so SQLite cannot publish a commit that is missing frames.
//! - If the main database does not promise powersafe overwrite (then SQLite pads commits to a
//!   sector and syncs in the middle of a frame), or the WAL cannot be matched to its database,
//!   the WAL is written through unchanged.
//!
//! A crash loses at most the collected frames of a transaction that had not committed, which
//! SQLite's recovery ignores anyway. Every database the connection writes must sync its
//! commits: sekali ATTACHes nothing and never lowers `synchronous` after the check at open.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::size_of;
use std::path::Path;
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, OnceLock};

use rusqlite::ffi;
use rusqlite::{Connection, OpenFlags};

/// The name the VFS is registered under.
pub const NAME: &CStr = c"sekali-wal-coalescing";

/// A write run longer than this is handed on at once rather than collected further.
const MAX_BUFFERED: usize = 512 * 1024;

/// The most the unix VFS writes in one call: it masks each write's length to 17 bits (SQLite
/// itself never writes more than a page at a time), so longer runs go in pieces of this size.
const MAX_WRITE: usize = 124 * 1024;

/// SQLite's WAL write lock is shared-memory lock 0 (`WAL_WRITE_LOCK` in sqlite3.c).
const WAL_WRITE_LOCK: c_int = 0;

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
            // Every method but xOpen is the default VFS's own. The unix VFS's ignore the VFS
            // pointer they are given, but for pAppData, which the copy keeps.
            let mut vfs: ffi::sqlite3_vfs = ptr::read(inner);
            vfs.szOsFile = (HEADER + (*inner).szOsFile as usize) as c_int;
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

/// Room for our part of a wrapped file; the default VFS's own file follows it, 8-aligned.
const HEADER: usize = {
    let largest = if size_of::<WalFile>() > size_of::<DbFile>() {
        size_of::<WalFile>()
    } else {
        size_of::<DbFile>()
    };
    largest.div_ceil(8) * 8
};

/// What SQLite holds for a WAL file opened through this VFS.
#[repr(C)]
struct WalFile {
    base: ffi::sqlite3_file,
    inner: *mut ffi::sqlite3_file,
    /// The database this WAL belongs to; null once either is closed.
    db: *mut DbFile,
    /// False: every write goes straight through (see the module docs).
    collect: bool,
    /// A collected write that failed: every later write and sync fails with it until the write
    /// lock is released.
    failed: c_int,
    /// Bytes written but not yet handed on, for the file range starting at `start`.
    pending: Vec<u8>,
    start: i64,
}

/// What SQLite holds for a main database file opened through this VFS.
#[repr(C)]
struct DbFile {
    base: ffi::sqlite3_file,
    inner: *mut ffi::sqlite3_file,
    /// The WAL opened for this database by the same connection, or null.
    wal: *mut WalFile,
    /// This connection holds the WAL write lock (shared-memory lock 0, exclusive).
    holds_write_lock: bool,
}

/// Open main databases by the filename pointer SQLite gave their xOpen, so that the WAL's
/// xOpen can find its database (`sqlite3_filename_database` returns that same pointer).
static OPEN_DBS: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

fn open_dbs() -> std::sync::MutexGuard<'static, Vec<(usize, usize)>> {
    OPEN_DBS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Calls the default VFS's method `$method` on its file `$inner` with `$args`; a method the
/// default VFS lacks (an older io_methods version) answers `$missing`.
macro_rules! call_inner {
    ($inner:expr, $method:ident, $missing:expr $(, $arg:expr)*) => {{
        let inner = $inner;
        match inner_methods(inner).$method {
            Some(method) => method(inner $(, $arg)*),
            None => $missing,
        }
    }};
}

unsafe extern "C" fn x_open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let inner_vfs = INNER.load(Ordering::Acquire);
    let inner_open = (*inner_vfs).xOpen.expect("a VFS has xOpen");
    let is_wal = flags & ffi::SQLITE_OPEN_WAL != 0;
    let is_main = flags & ffi::SQLITE_OPEN_MAIN_DB != 0;
    if !is_wal && !is_main {
        // Journals, temp files: the whole slot is the default VFS's file, with its methods.
        return inner_open(inner_vfs, name, file, flags, out_flags);
    }
    (*file).pMethods = ptr::null();
    let inner = file.cast::<u8>().add(HEADER).cast::<ffi::sqlite3_file>();
    let rc = inner_open(inner_vfs, name, inner, flags, out_flags);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    if is_main {
        ptr::write(
            file.cast::<DbFile>(),
            DbFile {
                base: ffi::sqlite3_file {
                    pMethods: &DB_METHODS,
                },
                inner,
                wal: ptr::null_mut(),
                holds_write_lock: false,
            },
        );
        if !name.is_null() {
            open_dbs().push((name as usize, file as usize));
        }
        return ffi::SQLITE_OK;
    }
    let wal = file.cast::<WalFile>();
    ptr::write(
        wal,
        WalFile {
            base: ffi::sqlite3_file {
                pMethods: &WAL_METHODS,
            },
            inner,
            db: ptr::null_mut(),
            collect: false,
            failed: ffi::SQLITE_OK,
            pending: Vec::new(),
            start: 0,
        },
    );
    let db_name = if name.is_null() {
        0
    } else {
        ffi::sqlite3_filename_database(name) as usize
    };
    let db = open_dbs()
        .iter()
        .find(|(n, _)| *n == db_name && db_name != 0)
        .map_or(ptr::null_mut(), |(_, db)| *db as *mut DbFile);
    if !db.is_null() {
        (*db).wal = wal;
        (*wal).db = db;
        let characteristics = call_inner!((*db).inner, xDeviceCharacteristics, 0);
        (*wal).collect = characteristics & ffi::SQLITE_IOCAP_POWERSAFE_OVERWRITE != 0;
    }
    ffi::SQLITE_OK
}

static WAL_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 1,
    xClose: Some(wal_close),
    xRead: Some(wal_read),
    xWrite: Some(wal_write),
    xTruncate: Some(wal_truncate),
    xSync: Some(wal_sync),
    xFileSize: Some(wal_file_size),
    xLock: Some(wal_lock),
    xUnlock: Some(wal_unlock),
    xCheckReservedLock: Some(wal_check_reserved_lock),
    xFileControl: Some(wal_file_control),
    xSectorSize: Some(wal_sector_size),
    xDeviceCharacteristics: Some(wal_device_characteristics),
    xShmMap: None,
    xShmLock: None,
    xShmBarrier: None,
    xShmUnmap: None,
    xFetch: None,
    xUnfetch: None,
};

/// The WalFile behind `file`.
///
/// # Safety
/// `file` must have been opened by [`x_open`] as a WAL file (it has `WAL_METHODS`), and SQLite
/// must not be using it from another thread (it never does: one connection, one thread).
unsafe fn wal<'a>(file: *mut ffi::sqlite3_file) -> &'a mut WalFile {
    &mut *file.cast::<WalFile>()
}

unsafe fn inner_methods<'a>(inner: *mut ffi::sqlite3_file) -> &'a ffi::sqlite3_io_methods {
    &*(*inner).pMethods
}

/// Hands the collected bytes on, in as few writes as the default VFS takes. A failure is kept
/// in `failed` (see there).
unsafe fn flush(wal: &mut WalFile) -> c_int {
    if wal.failed != ffi::SQLITE_OK {
        return wal.failed;
    }
    let write = inner_methods(wal.inner).xWrite.expect("a file has xWrite");
    let mut offset = wal.start;
    for chunk in wal.pending.chunks(MAX_WRITE) {
        let rc = write(
            wal.inner,
            chunk.as_ptr().cast::<c_void>(),
            chunk.len() as c_int,
            offset,
        );
        if rc != ffi::SQLITE_OK {
            wal.failed = rc;
            break;
        }
        offset += chunk.len() as i64;
    }
    wal.pending.clear();
    wal.failed
}

/// Drops what is collected, and a kept failure: the transaction they belonged to is over.
fn discard(wal: &mut WalFile) {
    wal.pending.clear();
    wal.failed = ffi::SQLITE_OK;
}

/// Hands on what is collected (best effort: it did not commit), then starts afresh.
unsafe fn settle(wal: &mut WalFile) {
    if !wal.pending.is_empty() {
        let _ = flush(wal);
    }
    discard(wal);
}

unsafe extern "C" fn wal_close(file: *mut ffi::sqlite3_file) -> c_int {
    let wal = wal(file);
    // Anything still collected did not commit (a commit syncs, which hands it on).
    discard(wal);
    if !wal.db.is_null() {
        (*wal.db).wal = ptr::null_mut();
    }
    let rc = call_inner!(wal.inner, xClose, ffi::SQLITE_OK);
    ptr::drop_in_place(&mut wal.pending);
    rc
}

unsafe extern "C" fn wal_read(
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
    call_inner!(
        wal.inner,
        xRead,
        ffi::SQLITE_IOERR_READ,
        buf,
        amount,
        offset
    )
}

unsafe extern "C" fn wal_write(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    let wal = wal(file);
    if !wal.collect {
        return call_inner!(
            wal.inner,
            xWrite,
            ffi::SQLITE_IOERR_WRITE,
            data,
            amount,
            offset
        );
    }
    if wal.failed != ffi::SQLITE_OK {
        return wal.failed;
    }
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

unsafe extern "C" fn wal_truncate(file: *mut ffi::sqlite3_file, size: i64) -> c_int {
    let wal = wal(file);
    let rc = flush(wal);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    call_inner!(wal.inner, xTruncate, ffi::SQLITE_IOERR_TRUNCATE, size)
}

unsafe extern "C" fn wal_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    let wal = wal(file);
    let rc = flush(wal);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    call_inner!(wal.inner, xSync, ffi::SQLITE_IOERR_FSYNC, flags)
}

unsafe extern "C" fn wal_file_size(file: *mut ffi::sqlite3_file, size: *mut i64) -> c_int {
    let wal = wal(file);
    let rc = flush(wal);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    call_inner!(wal.inner, xFileSize, ffi::SQLITE_IOERR_FSTAT, size)
}

unsafe extern "C" fn wal_lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    let wal = wal(file);
    call_inner!(wal.inner, xLock, ffi::SQLITE_IOERR_LOCK, level)
}

unsafe extern "C" fn wal_unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    let wal = wal(file);
    call_inner!(wal.inner, xUnlock, ffi::SQLITE_IOERR_UNLOCK, level)
}

unsafe extern "C" fn wal_check_reserved_lock(
    file: *mut ffi::sqlite3_file,
    out: *mut c_int,
) -> c_int {
    let wal = wal(file);
    call_inner!(
        wal.inner,
        xCheckReservedLock,
        ffi::SQLITE_IOERR_CHECKRESERVEDLOCK,
        out
    )
}

unsafe extern "C" fn wal_file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    let wal = wal(file);
    let rc = flush(wal);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    call_inner!(wal.inner, xFileControl, ffi::SQLITE_NOTFOUND, op, arg)
}

unsafe extern "C" fn wal_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    let wal = wal(file);
    call_inner!(wal.inner, xSectorSize, 4096)
}

unsafe extern "C" fn wal_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    let wal = wal(file);
    call_inner!(wal.inner, xDeviceCharacteristics, 0)
}

/// The main database: every method is the default VFS's, but `xShmLock` also drops what the
/// WAL has collected when the WAL write lock is released, and `xClose` unlinks the WAL.
static DB_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(db_close),
    xRead: Some(db_read),
    xWrite: Some(db_write),
    xTruncate: Some(db_truncate),
    xSync: Some(db_sync),
    xFileSize: Some(db_file_size),
    xLock: Some(db_lock),
    xUnlock: Some(db_unlock),
    xCheckReservedLock: Some(db_check_reserved_lock),
    xFileControl: Some(db_file_control),
    xSectorSize: Some(db_sector_size),
    xDeviceCharacteristics: Some(db_device_characteristics),
    xShmMap: Some(db_shm_map),
    xShmLock: Some(db_shm_lock),
    xShmBarrier: Some(db_shm_barrier),
    xShmUnmap: Some(db_shm_unmap),
    xFetch: Some(db_fetch),
    xUnfetch: Some(db_unfetch),
};

/// The default VFS's file behind a main database opened by [`x_open`].
///
/// # Safety
/// `file` must have `DB_METHODS`, and be used from one thread at a time (SQLite's rule).
unsafe fn db<'a>(file: *mut ffi::sqlite3_file) -> &'a mut DbFile {
    &mut *file.cast::<DbFile>()
}

/// Calls the default VFS's method `$method` on the main database file behind `$file`.
macro_rules! forward {
    ($file:expr, $method:ident, $missing:expr $(, $arg:expr)*) => {
        call_inner!(db($file).inner, $method, $missing $(, $arg)*)
    };
}

unsafe extern "C" fn db_close(file: *mut ffi::sqlite3_file) -> c_int {
    let db = db(file);
    open_dbs().retain(|(_, f)| *f != file as usize);
    if !db.wal.is_null() {
        (*db.wal).db = ptr::null_mut();
        db.wal = ptr::null_mut();
    }
    forward!(file, xClose, ffi::SQLITE_OK)
}

unsafe extern "C" fn db_read(
    file: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    forward!(file, xRead, ffi::SQLITE_IOERR_READ, buf, amount, offset)
}

unsafe extern "C" fn db_write(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    forward!(file, xWrite, ffi::SQLITE_IOERR_WRITE, data, amount, offset)
}

unsafe extern "C" fn db_truncate(file: *mut ffi::sqlite3_file, size: i64) -> c_int {
    forward!(file, xTruncate, ffi::SQLITE_IOERR_TRUNCATE, size)
}

unsafe extern "C" fn db_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    forward!(file, xSync, ffi::SQLITE_IOERR_FSYNC, flags)
}

unsafe extern "C" fn db_file_size(file: *mut ffi::sqlite3_file, size: *mut i64) -> c_int {
    forward!(file, xFileSize, ffi::SQLITE_IOERR_FSTAT, size)
}

unsafe extern "C" fn db_lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    forward!(file, xLock, ffi::SQLITE_IOERR_LOCK, level)
}

unsafe extern "C" fn db_unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    forward!(file, xUnlock, ffi::SQLITE_IOERR_UNLOCK, level)
}

unsafe extern "C" fn db_check_reserved_lock(
    file: *mut ffi::sqlite3_file,
    out: *mut c_int,
) -> c_int {
    forward!(
        file,
        xCheckReservedLock,
        ffi::SQLITE_IOERR_CHECKRESERVEDLOCK,
        out
    )
}

unsafe extern "C" fn db_file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    forward!(file, xFileControl, ffi::SQLITE_NOTFOUND, op, arg)
}

unsafe extern "C" fn db_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    forward!(file, xSectorSize, 4096)
}

unsafe extern "C" fn db_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    forward!(file, xDeviceCharacteristics, 0)
}

unsafe extern "C" fn db_shm_map(
    file: *mut ffi::sqlite3_file,
    page: c_int,
    page_size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    forward!(
        file,
        xShmMap,
        ffi::SQLITE_IOERR_SHMMAP,
        page,
        page_size,
        extend,
        out
    )
}

unsafe extern "C" fn db_shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    let write_lock = flags & ffi::SQLITE_SHM_EXCLUSIVE != 0
        && offset <= WAL_WRITE_LOCK
        && offset + n > WAL_WRITE_LOCK;
    let unlock = flags & ffi::SQLITE_SHM_UNLOCK != 0;
    let (wal, holds) = (db(file).wal, db(file).holds_write_lock);
    if !wal.is_null() && (!holds || (write_lock && unlock)) {
        // While no one else can write the WAL yet: see the module docs.
        settle(&mut *wal);
    }
    let rc = forward!(file, xShmLock, ffi::SQLITE_IOERR_SHMLOCK, offset, n, flags);
    if write_lock {
        db(file).holds_write_lock = !unlock && rc == ffi::SQLITE_OK;
    }
    rc
}

unsafe extern "C" fn db_shm_barrier(file: *mut ffi::sqlite3_file) {
    forward!(file, xShmBarrier, ())
}

unsafe extern "C" fn db_shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    forward!(file, xShmUnmap, ffi::SQLITE_OK, delete)
}

unsafe extern "C" fn db_fetch(
    file: *mut ffi::sqlite3_file,
    offset: i64,
    amount: c_int,
    out: *mut *mut c_void,
) -> c_int {
    forward!(
        file,
        xFetch,
        {
            *out = ptr::null_mut();
            ffi::SQLITE_OK
        },
        offset,
        amount,
        out
    )
}

unsafe extern "C" fn db_unfetch(
    file: *mut ffi::sqlite3_file,
    offset: i64,
    page: *mut c_void,
) -> c_int {
    forward!(file, xUnfetch, ffi::SQLITE_OK, offset, page)
}
