//! The weight store: every tensor of a checkpoint by name, read where it lies and converted
//! straight into the storage precision of the device tensor it is uploaded to.
//!
//! Sources:
//! * safetensors (`model.safetensors`, or the shards a `model.safetensors.index.json` lists),
//!   memory-mapped for the headers: nothing is read until a tensor is uploaded (or read by the
//!   host: [`View::to_f32`]), and then only its bytes, with positioned reads; f32, bf16 and
//!   f16 tensors, and pre-quantized weights: E4M3 codes `NAME` (`F8_E4M3`, `[rows, cols]`)
//!   with one f32 scale per row in `NAME_scale` (`[rows]` or `[rows, 1]`), each value
//!   `code · scale` ([`Stored::E4M3`]; [`Store::write_quantized`] writes them);
//! * CTranslate2 `model.bin` (binary versions 4 to 6; float32, float16 and bfloat16
//!   variables; integer scalars are kept as scalars, aliases resolved);
//! * generated f32 tensors held in memory (deterministic random models for tests and
//!   benchmarks).
//!
//! Lookup is hierarchical (`store.pp("layers").pp(3).get("q_proj.weight", &[out, in])`) and
//! every error carries the tensor's full name and the shape the model expected. An upload
//! reads the checkpoint file with positioned reads on several threads and converts (or
//! copies) the values straight into the staging slots of the store's [`Loader`] (page-locked
//! on CUDA; [`SLOTS`] of [`SLOT_BYTES`]), while the device copies the slots filled before:
//! loading a model needs no host copy of it (in f32 or otherwise), the file is read in large
//! requests, and the copies run at the link's speed.

mod write;

pub use write::Written;

use crate::error::{Error, Result};
use frt_exec::{Ctx, Loader, Stream};
use frt_kernels::{DType, Tensor};
use half::{bf16, f16};
use std::collections::HashMap;
use std::fmt::Display;
use std::path::{Path as FsPath, PathBuf};

/// The size of one staging slot of a store's uploads (see the module docs).
pub const SLOT_BYTES: usize = 32 << 20;

/// Staging slots of a store's uploads: one is filled while the others' copies run.
pub const SLOTS: usize = 3;

/// Bytes [`View::check_finite`] reads from a file at a time.
const CHECK_BYTES: usize = 8 << 20;

/// Values below which a slot is filled on the calling thread alone.
const PARALLEL_MIN: usize = 1 << 16;

/// Threads that fill one staging slot.
fn fill_threads() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get().min(8)))
}

/// How a tensor's values are stored in its source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    F32,
    BF16,
    F16,
    /// A pre-quantized 2-D weight: E4M3 codes, each row's values `code · scale` with the
    /// row's f32 scale from the tensor [`scale_name`] names. An FP8 upload takes the codes and
    /// scales as they are; every other read decodes them.
    E4M3,
}

impl Stored {
    pub fn size(self) -> usize {
        match self {
            Stored::F32 => 4,
            Stored::BF16 | Stored::F16 => 2,
            Stored::E4M3 => 1,
        }
    }

    /// The device dtype holding these values unchanged (for E4M3, the codes without their
    /// scales).
    pub fn dtype(self) -> DType {
        match self {
            Stored::F32 => DType::F32,
            Stored::BF16 => DType::BF16,
            Stored::F16 => DType::F16,
            Stored::E4M3 => DType::E4M3,
        }
    }
}

/// The name of the tensor holding the per-row scales of the pre-quantized weight `weight`.
pub fn scale_name(weight: &str) -> String {
    format!("{weight}_scale")
}

enum Bytes {
    /// A checkpoint file: mapped (headers) and open (uploads and the host's reads of tensors
    /// read it with positioned reads: large requests from several threads, no page faults,
    /// and a file cut short under the process is an error instead of a bus error).
    Mapped {
        map: memmap2::Mmap,
        file: std::fs::File,
        path: PathBuf,
    },
    /// One generated tensor's values, held as they were made (no copy).
    F32(Vec<f32>),
}

impl Bytes {
    fn get(&self) -> &[u8] {
        match self {
            Bytes::Mapped { map, .. } => map,
            // SAFETY: plain numbers, no padding; u8 has no alignment requirement. Read as
            // little-endian f32 (the stores' byte order), which is the host's (checked below).
            Bytes::F32(v) => unsafe {
                std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 4)
            },
        }
    }
}

// Generated tensors are read in place as little-endian bytes.
#[cfg(target_endian = "big")]
compile_error!("frt-nn reads host f32 values as little-endian bytes");

#[derive(Clone, Debug)]
struct Entry {
    source: usize,
    stored: Stored,
    shape: Vec<usize>,
    /// Byte range in the source.
    start: usize,
    len: usize,
    /// For E4M3 codes: the tensor holding their rows' scales (checked when opened), and
    /// their values once read.
    scale: Option<String>,
    scales: std::sync::OnceLock<std::sync::Arc<[f32]>>,
}

/// Bytes read from checkpoints by uploads in this process, for progress reports.
static BYTES_READ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Bytes of stored tensors that uploads have read so far in this process (all stores).
pub fn bytes_read() -> u64 {
    BYTES_READ.load(std::sync::atomic::Ordering::Relaxed)
}

fn count_read(bytes: usize) {
    BYTES_READ.fetch_add(bytes as u64, std::sync::atomic::Ordering::Relaxed);
}

/// Every tensor of one checkpoint (see the module docs).
pub struct Store {
    /// The folder or file it was opened from, for messages.
    origin: PathBuf,
    sources: Vec<Bytes>,
    entries: HashMap<String, Entry>,
    scalars: HashMap<String, i64>,
    /// The staging slots of uploads, made on the first upload (for that upload's context)
    /// and freed with the store.
    loader: std::sync::Mutex<Option<Loader>>,
    /// Names that are aliases of other tensors (written once, under the target's name).
    aliases: std::collections::HashSet<String>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("origin", &self.origin)
            .field("tensors", &self.entries.len())
            .finish()
    }
}

fn io(path: &FsPath) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn bad(file: &FsPath, reason: impl Into<String>) -> Error {
    Error::BadCheckpoint {
        file: file.to_path_buf(),
        reason: reason.into(),
    }
}

fn map(path: &FsPath) -> Result<Bytes> {
    let file = std::fs::File::open(path).map_err(io(path))?;
    // SAFETY: the map is read-only and lives as long as the store; a checkpoint file changed
    // by another process while a model loads is outside what the loader can defend against
    // (as with any reader of a file being rewritten).
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io(path))?;
    Ok(Bytes::Mapped {
        map,
        file,
        path: path.to_path_buf(),
    })
}

impl Store {
    /// A checkpoint folder: `model.safetensors`, the shards of `model.safetensors.index.json`,
    /// or a CTranslate2 `model.bin`, whichever is there (in that order).
    pub fn open(dir: &FsPath) -> Result<Store> {
        if !dir.is_dir() {
            return Err(Error::ModelFolder {
                dir: dir.to_path_buf(),
                reason: "not a directory".into(),
            });
        }
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let ct2 = dir.join("model.bin");
        if single.is_file() {
            Store::safetensors(dir, &[single])
        } else if index.is_file() {
            Store::safetensors(dir, &shards(&index)?)
        } else if ct2.is_file() {
            Store::ctranslate2(&ct2)
        } else {
            Err(Error::ModelFolder {
                dir: dir.to_path_buf(),
                reason: "none of model.safetensors, model.safetensors.index.json, model.bin".into(),
            })
        }
    }

    /// safetensors files, memory-mapped; `origin` names them in messages. A name in two files
    /// is an error.
    pub fn safetensors(origin: &FsPath, files: &[PathBuf]) -> Result<Store> {
        let mut store = Store::empty(origin);
        for file in files {
            let mapped = map(file)?;
            let bytes = mapped.get();
            let st = safetensors::SafeTensors::deserialize(bytes)
                .map_err(|e| bad(file, e.to_string()))?;
            let base = bytes.as_ptr() as usize;
            let source = store.sources.len();
            for (name, view) in st.tensors() {
                let stored = match view.dtype() {
                    safetensors::Dtype::F32 => Stored::F32,
                    safetensors::Dtype::BF16 => Stored::BF16,
                    safetensors::Dtype::F16 => Stored::F16,
                    safetensors::Dtype::F8_E4M3 => Stored::E4M3,
                    other => return Err(bad(file, format!("`{name}` has dtype {other:?}"))),
                };
                let data = view.data();
                let entry = Entry {
                    source,
                    stored,
                    shape: view.shape().to_vec(),
                    start: data.as_ptr() as usize - base,
                    len: data.len(),
                    scale: (stored == Stored::E4M3).then(|| scale_name(&name)),
                    scales: Default::default(),
                };
                if store.entries.insert(name.clone(), entry).is_some() {
                    return Err(bad(file, format!("`{name}` is in more than one file")));
                }
            }
            store.sources.push(mapped);
        }
        store.check_scales()?;
        Ok(store)
    }

    /// Every E4M3 tensor is 2-D and has its scales: an f32 tensor of one value per row.
    fn check_scales(&self) -> Result<()> {
        for (name, e) in &self.entries {
            let Some(scale) = &e.scale else { continue };
            let wrong = |reason: String| Error::BadCheckpoint {
                file: self.origin.clone(),
                reason: format!("the E4M3 weight `{name}`: {reason}"),
            };
            let rows = match e.shape[..] {
                [r, c] if r > 0 && c > 0 => r,
                _ => return Err(wrong(format!("shape {:?}, not [rows, cols]", e.shape))),
            };
            let s = self
                .entries
                .get(scale)
                .ok_or_else(|| wrong(format!("no tensor `{scale}` of its {rows} rows' scales")))?;
            if s.stored != Stored::F32 || !(s.shape == [rows] || s.shape == [rows, 1]) {
                return Err(wrong(format!(
                    "its scales `{scale}` are {:?} {:?}, not f32 [{rows}]",
                    s.stored, s.shape
                )));
            }
        }
        Ok(())
    }

    /// A CTranslate2 `model.bin` (binary versions 4 to 6), memory-mapped.
    pub fn ctranslate2(file: &FsPath) -> Result<Store> {
        let mapped = map(file)?;
        let bytes = mapped.get();
        let mut store = Store::empty(file);
        let mut rd = Reader {
            b: bytes,
            at: 0,
            file,
        };
        let version = rd.u32()?;
        if !(4..=6).contains(&version) {
            return Err(bad(
                file,
                format!("binary version {version} (supported: 4 to 6)"),
            ));
        }
        let spec = rd.string()?;
        store.scalars.insert(format!("spec:{spec}"), 1);
        let _revision = rd.u32()?;
        let count = rd.u32()?;
        for _ in 0..count {
            let name = rd.string()?;
            let rank = rd.bytes(1)?[0] as usize;
            let dims: Vec<usize> = (0..rank)
                .map(|_| rd.u32().map(|v| v as usize))
                .collect::<Result<_>>()?;
            let dtype = rd.bytes(1)?[0];
            let nbytes = rd.u32()? as usize;
            let start = rd.at;
            let raw = rd.bytes(nbytes)?;
            // Checked: a corrupt header's dimensions may overflow.
            let n = dims
                .iter()
                .try_fold(1usize, |a, d| a.checked_mul(*d))
                .filter(|n| n.checked_mul(4).is_some())
                .ok_or_else(|| bad(file, format!("`{name}`: shape {dims:?} overflows")))?;
            let stored = match dtype {
                0 if nbytes == n * 4 => Stored::F32,
                4 if nbytes == n * 2 => Stored::F16,
                5 if nbytes == n * 2 => Stored::BF16,
                1..=3 if rank == 0 => {
                    // Scalars (flags, head counts) of integer types.
                    let v = match nbytes {
                        1 => raw[0] as i8 as i64,
                        2 => i16::from_le_bytes([raw[0], raw[1]]) as i64,
                        4 => i32::from_le_bytes(raw.try_into().expect("4 bytes")) as i64,
                        _ => return Err(bad(file, format!("scalar `{name}` of {nbytes} bytes"))),
                    };
                    store.scalars.insert(name, v);
                    continue;
                }
                1 | 2 => {
                    return Err(bad(
                        file,
                        format!(
                            "`{name}` is quantized (int8/int16); convert the model with float16 or float32 weights"
                        ),
                    ));
                }
                _ => {
                    return Err(bad(
                        file,
                        format!(
                            "`{name}`: data type {dtype} with {nbytes} bytes for shape {dims:?}"
                        ),
                    ));
                }
            };
            store.entries.insert(
                name,
                Entry {
                    source: 0,
                    stored,
                    shape: dims,
                    start,
                    len: nbytes,
                    scale: None,
                    scales: Default::default(),
                },
            );
        }
        // Aliases (e.g. the output projection sharing the embedding).
        let n = rd.u32()?;
        for _ in 0..n {
            let alias = rd.string()?;
            let target = rd.string()?;
            store.alias(&alias, &target);
        }
        store.sources.push(mapped);
        Ok(store)
    }

    /// Generated f32 tensors (name, shape, values), held in memory; `origin` describes them.
    pub fn from_f32(
        origin: &str,
        tensors: impl IntoIterator<Item = (String, Vec<usize>, Vec<f32>)>,
    ) -> Store {
        let mut store = Store::empty(FsPath::new(origin));
        for (name, shape, values) in tensors {
            let entry = Entry {
                source: store.sources.len(),
                stored: Stored::F32,
                shape,
                start: 0,
                len: values.len() * 4,
                scale: None,
                scales: Default::default(),
            };
            store.sources.push(Bytes::F32(values));
            store.entries.insert(name, entry);
        }
        store
    }

    fn empty(origin: &FsPath) -> Store {
        Store {
            origin: origin.to_path_buf(),
            sources: Vec::new(),
            entries: HashMap::new(),
            scalars: HashMap::new(),
            aliases: Default::default(),
            loader: std::sync::Mutex::new(None),
        }
    }

    /// The folder or file the store was opened from.
    pub fn origin(&self) -> &FsPath {
        &self.origin
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.entries.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The stored size of every tensor, in bytes.
    pub fn stored_bytes(&self) -> u64 {
        self.entries.values().map(|e| e.len as u64).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// How the tensor `name` is stored, if it is there (reads nothing).
    pub fn stored_as(&self, name: &str) -> Option<Stored> {
        self.entries.get(name).map(|e| e.stored)
    }

    /// An integer scalar of a CTranslate2 model (`encoder/num_heads`); `spec:{name}` is set
    /// for the model's spec name.
    pub fn scalar(&self, name: &str) -> Option<i64> {
        self.scalars.get(name).copied()
    }

    /// Makes `alias` name the tensor `target` (a tied weight kept under one name); false when
    /// `target` is absent.
    pub fn alias(&mut self, alias: &str, target: &str) -> bool {
        match self.entries.get(target).cloned() {
            Some(e) => {
                self.entries.insert(alias.to_string(), e);
                self.aliases.insert(alias.to_string());
                true
            }
            None => false,
        }
    }

    /// The root of the hierarchical lookup.
    pub fn root(&self) -> Path<'_> {
        Path {
            store: self,
            prefix: String::new(),
        }
    }

    /// `root().pp(part)`.
    pub fn pp(&self, part: impl Display) -> Path<'_> {
        self.root().pp(part)
    }

    /// The tensor `name`, whatever its shape.
    pub fn view(&self, name: &str) -> Result<View<'_>> {
        let e = self.entries.get(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_string(),
            expected: vec![],
        })?;
        let source = &self.sources[e.source];
        // A pre-quantized weight's scales, read now (one value a row): finite, and finite
        // times the largest code.
        let scales = match &e.scale {
            // Read once for every view of the weight (a lookup that checks shapes, then the
            // upload); only scales that passed are kept.
            Some(sn) => Some(match e.scales.get() {
                Some(v) => v.clone(),
                None => {
                    let v = self.view(sn)?.to_f32()?;
                    if !v
                        .iter()
                        .all(|s| (s * frt_kernels::fp8::E4M3_MAX).is_finite())
                    {
                        return Err(Error::NonFinite { name: sn.clone() });
                    }
                    e.scales.get_or_init(|| std::sync::Arc::from(v)).clone()
                }
            }),
            None => None,
        };
        Ok(View {
            name: name.to_string(),
            stored: e.stored,
            shape: &e.shape,
            bytes: &source.get()[e.start..e.start + e.len],
            scales,
            loader: &self.loader,
            file: match source {
                Bytes::Mapped { file, path, .. } => Some((file, path.as_path(), e.start)),
                Bytes::F32(_) => None,
            },
        })
    }

    /// Checks every tensor for non-finite values (reads the whole checkpoint once, a few MiB
    /// at a time).
    pub fn check_finite(&self) -> Result<()> {
        for name in self.names() {
            self.view(name)?.check_finite()?;
        }
        Ok(())
    }
}

/// The shard files of a `model.safetensors.index.json`, sorted.
fn shards(index: &FsPath) -> Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string(index).map_err(io(index))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(index, e.to_string()))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad(index, "no weight_map"))?;
    let mut f: Vec<&str> = map.values().filter_map(|x| x.as_str()).collect();
    f.sort_unstable();
    f.dedup();
    let dir = index.parent().unwrap_or(FsPath::new("."));
    Ok(f.into_iter().map(|n| dir.join(n)).collect())
}

/// A cursor over a file's bytes; running off the end is an error naming the offset.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
    file: &'a FsPath,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        let s = self
            .at
            .checked_add(n)
            .and_then(|end| self.b.get(self.at..end))
            .ok_or_else(|| {
                bad(
                    self.file,
                    format!("truncated: {n} bytes wanted at offset {}", self.at),
                )
            })?;
        self.at += n;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.bytes(4)?.try_into().expect("4 bytes"),
        ))
    }
    /// A u16 length (NUL included) and the characters.
    fn string(&mut self) -> Result<String> {
        let n = u16::from_le_bytes(self.bytes(2)?.try_into().expect("2 bytes")) as usize;
        let s = self.bytes(n)?;
        Ok(String::from_utf8_lossy(s.strip_suffix(&[0]).unwrap_or(s)).into_owned())
    }
}

/// A place in the store's name hierarchy: parts joined with `.` (`a.b.c`). Checkpoints that
/// name with slashes (CTranslate2: `encoder/layer_0/...`) are looked up by whole names from the
/// root.
#[derive(Clone)]
pub struct Path<'a> {
    store: &'a Store,
    prefix: String,
}

impl<'a> Path<'a> {
    /// The sub-path `part` (joined with `.`; `store.pp("encoder/layer_0")` style names with
    /// slashes may be given whole).
    pub fn pp(&self, part: impl Display) -> Path<'a> {
        Path {
            store: self.store,
            prefix: self.name(part),
        }
    }

    /// The full name of `leaf` under this path.
    pub fn name(&self, leaf: impl Display) -> String {
        if self.prefix.is_empty() {
            leaf.to_string()
        } else {
            format!("{}.{leaf}", self.prefix)
        }
    }

    pub fn store(&self) -> &'a Store {
        self.store
    }

    pub fn contains(&self, leaf: impl Display) -> bool {
        self.store.contains(&self.name(leaf))
    }

    /// The tensor `leaf`, which must have `shape`.
    pub fn get(&self, leaf: impl Display, shape: &[usize]) -> Result<View<'a>> {
        let name = self.name(leaf);
        let v = self.store.view(&name).map_err(|e| match e {
            Error::MissingTensor { .. } => Error::MissingTensor {
                name: name.clone(),
                expected: shape.to_vec(),
            },
            // A pre-quantized weight's scales unreadable or not finite.
            other => other,
        })?;
        if v.shape != shape {
            return Err(Error::TensorShape {
                name,
                got: v.shape.to_vec(),
                expected: shape.to_vec(),
            });
        }
        Ok(v)
    }

    /// The tensor `leaf`, whatever its shape.
    pub fn get_any(&self, leaf: impl Display) -> Result<View<'a>> {
        self.store.view(&self.name(leaf))
    }

    /// `get(leaf, shape)` uploaded as a new tensor of `dtype` on `s`.
    pub fn upload(
        &self,
        leaf: impl Display,
        shape: &[usize],
        ctx: &Ctx,
        s: Stream,
        dtype: DType,
    ) -> Result<Tensor> {
        self.get(leaf, shape)?.upload(ctx, s, dtype)
    }
}

/// One tensor as stored (borrowed from the store).
#[derive(Clone, Debug)]
pub struct View<'a> {
    name: String,
    stored: Stored,
    shape: &'a [usize],
    bytes: &'a [u8],
    /// The rows' scales of E4M3 codes ([`Stored::E4M3`]).
    scales: Option<std::sync::Arc<[f32]>>,
    /// The store's staging slots.
    loader: &'a std::sync::Mutex<Option<Loader>>,
    /// The file the bytes lie in (and its path) and where: uploads read it.
    #[cfg_attr(not(unix), allow(dead_code))]
    file: Option<(&'a std::fs::File, &'a FsPath, usize)>,
}

impl<'a> View<'a> {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tensor's stored size, in bytes (what an upload of it reads: [`bytes_read`]); a
    /// pre-quantized weight's with its scales.
    pub fn stored_len(&self) -> usize {
        self.bytes.len() + self.scales.as_ref().map_or(0, |s| 4 * s.len())
    }

    pub fn shape(&self) -> &'a [usize] {
        self.shape
    }

    pub fn stored(&self) -> Stored {
        self.stored
    }

    pub fn numel(&self) -> usize {
        self.bytes.len() / self.stored.size()
    }

    /// The values as f32 (allocates: for small tensors the host computes with, and tools),
    /// read as uploads read them: a checkpoint cut short under the process is an I/O error.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let mut out = vec![0f32; self.numel()];
        self.read_f32(0, &mut out)?;
        Ok(out)
    }

    /// Values `from..from + out.len()` as f32.
    fn convert(&self, from: usize, out: &mut [f32]) {
        let sz = self.stored.size();
        self.decode(from, &self.bytes[from * sz..(from + out.len()) * sz], out);
    }

    /// The stored bytes `raw` of values `from..` as f32 into `out` (E4M3 codes times their
    /// rows' scales).
    fn decode(&self, from: usize, raw: &[u8], out: &mut [f32]) {
        match &self.scales {
            Some(scales) => {
                let cols = self.shape[1];
                let table = e4m3_values();
                for (at, (o, c)) in (from..).zip(out.iter_mut().zip(raw)) {
                    *o = table[*c as usize] * scales[at / cols];
                }
            }
            None => decode(self.stored, raw, out),
        }
    }

    /// The E4M3 rows' scales; `None` for other tensors.
    pub fn scales(&self) -> Option<&[f32]> {
        self.scales.as_deref()
    }

    /// [`convert`](Self::convert) for uploads: read from the file with a positioned read when
    /// the tensor lies in one (as [`fill_part`](Self::fill_part) reads), else from memory.
    fn read_f32(&self, from: usize, out: &mut [f32]) -> Result<()> {
        #[cfg(unix)]
        if let Some((file, path, start)) = self.file {
            use std::os::unix::fs::FileExt;
            let sz = self.stored.size();
            let mut raw = vec![0u8; out.len() * sz];
            file.read_exact_at(&mut raw, (start + from * sz) as u64)
                .map_err(io(path))?;
            self.decode(from, &raw, out);
            return Ok(());
        }
        self.convert(from, out);
        Ok(())
    }

    /// An error naming the tensor when a value is NaN or infinite (read as uploads read: a
    /// checkpoint cut short under the process is an I/O error).
    pub fn check_finite(&self) -> Result<()> {
        let finite = match self.finite_in_file() {
            Some(r) => r?,
            None => all_finite(self.stored, self.bytes),
        };
        if finite {
            Ok(())
        } else {
            Err(Error::NonFinite {
                name: self.name.clone(),
            })
        }
    }

    /// Whether every value is finite, read from the file a few MiB at a time with positioned
    /// reads; `None` where the tensor does not lie in a file.
    fn finite_in_file(&self) -> Option<Result<bool>> {
        #[cfg(unix)]
        if let Some((file, path, start)) = self.file {
            use std::os::unix::fs::FileExt;
            let len = self.bytes.len();
            // Whole values: every stored size divides the step.
            let mut raw = vec![0u8; CHECK_BYTES.min(len)];
            let mut at = 0;
            while at < len {
                let part = &mut raw[..CHECK_BYTES.min(len - at)];
                if let Err(e) = file.read_exact_at(part, (start + at) as u64) {
                    return Some(Err(io(path)(e)));
                }
                if !all_finite(self.stored, part) {
                    return Some(Ok(false));
                }
                at += part.len();
            }
            return Some(Ok(true));
        }
        None
    }

    /// Uploads the tensor as a new contiguous tensor of `dtype` (f32, bf16 or f16).
    pub fn upload(&self, ctx: &Ctx, s: Stream, dtype: DType) -> Result<Tensor> {
        let t = Tensor::alloc(ctx, &self.name, dtype, self.shape)?;
        self.write_into(&t, s, 0)?;
        Ok(t)
    }

    /// The store's staging slots, made for `ctx` (another context's are freed, after their
    /// copies, before new ones are made); the guard holds `Some`.
    fn staging(&self, ctx: &Ctx) -> Result<std::sync::MutexGuard<'a, Option<Loader>>> {
        let mut guard = self.loader.lock().unwrap_or_else(|p| p.into_inner());
        if guard.as_ref().is_none_or(|l| !l.ctx().same(ctx)) {
            *guard = None;
            *guard = Some(Loader::new(ctx, SLOT_BYTES, SLOTS)?);
        }
        Ok(guard)
    }

    /// Writes the values into the contiguous float tensor `t` from its element `at` on,
    /// converted to `t`'s dtype (as `f32 → dtype` rounds: bf16 and f16 round to nearest even),
    /// ordered on `s`. A non-finite value is an error naming the tensor (nothing of the
    /// staging slot that holds it is written; the slots before it are).
    pub fn write_into(&self, t: &Tensor, s: Stream, at: usize) -> Result<()> {
        let upload_err = |reason: String| Error::Upload {
            name: self.name.clone(),
            reason,
        };
        if !t.is_contiguous() || !t.dtype().is_float() {
            return Err(upload_err(format!(
                "into {t:?}: not a contiguous float tensor"
            )));
        }
        let n = self.numel();
        if at + n > t.numel() {
            return Err(upload_err(format!("{n} values at element {at} of {t:?}")));
        }
        let dt = t.dtype();
        if !matches!(dt, DType::F32 | DType::BF16 | DType::F16) {
            return Err(upload_err(format!("into dtype {dt:?}")));
        }
        let base = (t.offset() + at) * dt.size();
        let buffer = t.buffer();
        let mut guard = self.staging(buffer.ctx())?;
        let loader = guard.as_mut().expect("made by staging");
        let per_slot = loader.slot_bytes() / dt.size();
        let (ssz, dsz) = (self.stored.size(), dt.size());
        let mut from = 0;
        while from < n {
            let len = per_slot.min(n - from);
            let out = &mut loader.slot()?[..len * dsz];
            let per = len.div_ceil(fill_threads_for(len, len));
            let parts: Vec<_> = out
                .chunks_mut(per * dsz)
                .enumerate()
                .map(|(k, o)| ((from + k * per) * ssz, o))
                .collect();
            let finite = fill_in_parts(parts, |(at, o)| self.fill_part(at, o, dt))?;
            if !finite {
                // Nothing of this slot is sent.
                return Err(Error::NonFinite {
                    name: self.name.clone(),
                });
            }
            loader.send(s, buffer, base + from * dsz, len * dsz)?;
            count_read(len * ssz);
            from += len;
        }
        if let Some(scales) = &self.scales {
            count_read(4 * scales.len());
        }
        Ok(())
    }
}

impl View<'_> {
    /// Fills `out` with this tensor's values from byte `at` of its stored bytes on, as `dt`
    /// ([`fill`]): read from the file when it is one, else from memory. Ok(false) when a
    /// value is not finite.
    fn fill_part(&self, at: usize, out: &mut [u8], dt: DType) -> Result<bool> {
        if self.scales.is_some() && dt != DType::E4M3 {
            // Codes decoded with their scales, then converted as f32 values are (a code is a
            // byte: `at` is the first value's index).
            let mut values = vec![0f32; out.len() / dt.size()];
            self.read_f32(at, &mut values)?;
            // SAFETY: plain f32 values viewed as their little-endian bytes (checked above).
            let bytes = unsafe {
                std::slice::from_raw_parts(values.as_ptr() as *const u8, values.len() * 4)
            };
            return Ok(fill(Stored::F32, bytes, dt, out));
        }
        let len = out.len() / dt.size() * self.stored.size();
        #[cfg(unix)]
        if let Some((file, path, start)) = self.file {
            use std::os::unix::fs::FileExt;
            let offset = (start + at) as u64;
            if self.stored.dtype() == dt {
                file.read_exact_at(out, offset).map_err(io(path))?;
                return Ok(all_finite(self.stored, out));
            }
            let mut raw = vec![0u8; len];
            file.read_exact_at(&mut raw, offset).map_err(io(path))?;
            return Ok(fill(self.stored, &raw, dt, out));
        }
        Ok(fill(self.stored, &self.bytes[at..at + len], dt, out))
    }
}

/// Threads to fill a staging slot of `values` values split into at most `units` parts: one
/// below [`PARALLEL_MIN`] values, else up to [`fill_threads`].
fn fill_threads_for(values: usize, units: usize) -> usize {
    if values < PARALLEL_MIN {
        1
    } else {
        fill_threads().min(units).max(1)
    }
}

/// Fills the parts of a staging slot with `fill`, one thread each (the calling thread where
/// there is one part), every thread joined before the answer (no early return): whether all
/// their values were finite, or the first error.
fn fill_in_parts<W: Send>(parts: Vec<W>, fill: impl Fn(W) -> Result<bool> + Sync) -> Result<bool> {
    if parts.len() <= 1 {
        return parts
            .into_iter()
            .try_fold(true, |ok, w| fill(w).map(|f| f & ok));
    }
    let fill = &fill;
    std::thread::scope(|scope| {
        let threads: Vec<_> = parts
            .into_iter()
            .map(|w| scope.spawn(move || fill(w)))
            .collect();
        let done: Vec<Result<bool>> = threads
            .into_iter()
            .map(|t| t.join().expect("filling a staging slot"))
            .collect();
        done.into_iter()
            .try_fold(true, |ok, r| r.map(|finite| finite & ok))
    })
}

/// The value of every E4M3 code.
fn e4m3_values() -> &'static [f32; 256] {
    static T: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
    T.get_or_init(|| std::array::from_fn(|c| frt_kernels::fp8::e4m3_to_f32(c as u8)))
}

/// The values stored as `stored` in `b` as f32, into `out` (one for each value; E4M3 codes
/// without their scales).
fn decode(stored: Stored, b: &[u8], out: &mut [f32]) {
    match stored {
        Stored::E4M3 => {
            let table = e4m3_values();
            for (o, c) in out.iter_mut().zip(b) {
                *o = table[*c as usize];
            }
        }
        Stored::F32 => {
            for (o, c) in out.iter_mut().zip(b.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        Stored::BF16 => {
            for (o, c) in out.iter_mut().zip(b.chunks_exact(2)) {
                *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        Stored::F16 => {
            for (o, c) in out.iter_mut().zip(b.chunks_exact(2)) {
                *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
    }
}

/// Converts the values stored as `stored` in `src` into `out` as `dt` (f32, bf16 or f16; as
/// `f32 → dt` rounds: to nearest even), or copies them when `dt` is their own precision;
/// false when one is not finite (then `out` holds something unspecified).
fn fill(stored: Stored, src: &[u8], dt: DType, out: &mut [u8]) -> bool {
    if stored.dtype() == dt {
        if !all_finite(stored, src) {
            return false;
        }
        out.copy_from_slice(src);
        return true;
    }
    match dt {
        DType::F32 => convert_into(stored, src, out, f32::to_le_bytes),
        DType::BF16 => convert_into(stored, src, out, |v| bf16::from_f32(v).to_le_bytes()),
        DType::F16 => convert_into(stored, src, out, |v| f16::from_f32(v).to_le_bytes()),
        _ => unreachable!("checked by write_into"),
    }
}

/// [`fill`] between two precisions, `N` bytes a value out; false on a non-finite value.
fn convert_into<const N: usize>(
    stored: Stored,
    src: &[u8],
    out: &mut [u8],
    encode: impl Fn(f32) -> [u8; N],
) -> bool {
    let mut finite = true;
    let mut put = |o: &mut [u8], v: f32| {
        finite &= v.is_finite();
        o.copy_from_slice(&encode(v));
    };
    let outs = out.chunks_exact_mut(N);
    match stored {
        Stored::F32 => outs
            .zip(src.chunks_exact(4))
            .for_each(|(o, c)| put(o, f32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
        Stored::BF16 => outs
            .zip(src.chunks_exact(2))
            .for_each(|(o, c)| put(o, bf16::from_le_bytes([c[0], c[1]]).to_f32())),
        Stored::F16 => outs
            .zip(src.chunks_exact(2))
            .for_each(|(o, c)| put(o, f16::from_le_bytes([c[0], c[1]]).to_f32())),
        // Decoded with their scales before (`View::fill_part`).
        Stored::E4M3 => unreachable!("E4M3 codes are converted through f32"),
    }
    finite
}

/// Whether every value stored as `stored` in `bytes` is finite (no copy).
fn all_finite(stored: Stored, bytes: &[u8]) -> bool {
    match stored {
        Stored::F32 => bytes
            .chunks_exact(4)
            .all(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_finite()),
        // All-ones exponent: an infinity or a NaN.
        Stored::BF16 => bytes
            .chunks_exact(2)
            .all(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7f80 != 0x7f80),
        Stored::F16 => bytes
            .chunks_exact(2)
            .all(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7c00 != 0x7c00),
        // No infinities; NaN is S.1111.111.
        Stored::E4M3 => bytes.iter().all(|c| c & 0x7f != 0x7f),
    }
}

/// A weight quantized per output feature for FP8 GEMMs
/// ([`Kernels::linear_e4m3`](frt_kernels::Kernels::linear_e4m3)): E4M3 codes `[rows, cols]` and
/// one f32 scale per row, `w[r, c] ≈ value(codes[r, c]) · scales[r]`
/// ([`quantize_rows_e4m3`](frt_kernels::fp8::quantize_rows_e4m3)).
#[derive(Clone)]
pub struct QuantizedWeight {
    pub codes: Tensor,
    pub scales: Tensor,
}

/// Values a thread of [`View::write_e4m3_rows`] converts to f32 and quantizes at a time: about
/// 4 MiB of f32.
const QUANTIZE_VALUES: usize = 1 << 20;

/// Codes of one pass of [`View::write_e4m3_rows`] at most: each pass fills a staging slot (the
/// rows split over the threads that fill it), whose copy to the device runs while the next
/// pass fills another.
const E4M3_PASS: usize = 8 << 20;

impl View<'_> {
    /// Uploads a 2-D weight `[rows, cols]` quantized per row (see [`QuantizedWeight`]).
    pub fn upload_e4m3(&self, ctx: &Ctx, s: Stream) -> Result<QuantizedWeight> {
        upload_stacked_e4m3(std::slice::from_ref(self), ctx, s)
    }

    /// Quantizes this 2-D weight's rows into `q`'s rows from `row_at` on, through the store's
    /// staging slots as [`write_into`](Self::write_into) uploads (read with positioned reads,
    /// several threads filling a slot; the host holds no copy of the whole weight). The codes
    /// and scales are [`quantize_rows_e4m3`](frt_kernels::fp8::quantize_rows_e4m3)'s of the
    /// whole weight: each row's are its own. A non-finite value is an error naming the tensor.
    /// A pre-quantized weight ([`Stored::E4M3`]) gives its codes and scales as they are.
    fn write_e4m3_rows(&self, q: &QuantizedWeight, s: Stream, row_at: usize) -> Result<()> {
        let upload_err = |reason: String| Error::Upload {
            name: self.name.clone(),
            reason,
        };
        let (rows, cols) = match self.shape {
            [r, c] if *r > 0 && *c > 0 => (*r, *c),
            _ => {
                return Err(upload_err(format!(
                    "an FP8 weight is 2-D with rows and columns, not {:?}",
                    self.shape
                )));
            }
        };
        let buffer = q.codes.buffer();
        let mut guard = self.staging(buffer.ctx())?;
        let loader = guard.as_mut().expect("made by staging");
        if cols > loader.slot_bytes() {
            return Err(upload_err(format!(
                "a row of {cols} codes exceeds a staging slot of {} bytes",
                loader.slot_bytes()
            )));
        }
        let pass_rows = (E4M3_PASS.min(loader.slot_bytes()) / cols).max(1);
        let base = q.codes.offset() + row_at * cols;
        let mut scales = vec![0f32; rows];
        let mut r = 0;
        while r < rows {
            let n = pass_rows.min(rows - r);
            let out = &mut loader.slot()?[..n * cols];
            self.e4m3_pass(r, cols, out, &mut scales[r..r + n])?;
            loader.send(s, buffer, base + r * cols, n * cols)?;
            count_read(n * cols * self.stored.size());
            r += n;
        }
        q.scales.narrow(0, row_at, rows)?.write_f32(s, &scales)?;
        if self.scales.is_some() {
            count_read(4 * rows);
        }
        Ok(())
    }

    /// The E4M3 codes of rows `r..r + scales.len()` of this `[_, cols]` weight into `out`
    /// and their scales into `scales`: quantized per row, the rows split over up to
    /// [`fill_threads`] threads, or as stored for a pre-quantized weight. A non-finite value
    /// is an error naming the tensor.
    fn e4m3_pass(&self, r: usize, cols: usize, out: &mut [u8], scales: &mut [f32]) -> Result<()> {
        let n = scales.len();
        let per = n.div_ceil(fill_threads_for(n * cols, n));
        let parts: Vec<_> = out
            .chunks_mut(per * cols)
            .zip(scales.chunks_mut(per))
            .enumerate()
            .map(|(k, (o, sc))| (r + k * per, o, sc))
            .collect();
        let finite = fill_in_parts(parts, |(first, o, sc)| match &self.scales {
            Some(stored) => {
                sc.copy_from_slice(&stored[first..first + sc.len()]);
                self.fill_part(first * cols, o, DType::E4M3)
            }
            None => self.quantize_rows(first, cols, o, sc),
        })?;
        if finite {
            Ok(())
        } else {
            Err(Error::NonFinite {
                name: self.name.clone(),
            })
        }
    }

    /// Rows `first..first + scales.len()` of this `[_, cols]` weight quantized per row into
    /// `codes` and `scales`, a few rows at a time. Ok(false) when a value is not finite.
    fn quantize_rows(
        &self,
        first: usize,
        cols: usize,
        codes: &mut [u8],
        scales: &mut [f32],
    ) -> Result<bool> {
        let rows = scales.len();
        let per = (QUANTIZE_VALUES / cols).max(1);
        let mut values = vec![0f32; per.min(rows) * cols];
        let mut r = 0;
        while r < rows {
            let n = per.min(rows - r);
            let part = &mut values[..n * cols];
            self.read_f32((first + r) * cols, part)?;
            if part.iter().any(|v| !v.is_finite()) {
                return Ok(false);
            }
            let (c, sc) = frt_kernels::fp8::quantize_rows_e4m3(part, n, cols);
            codes[r * cols..(r + n) * cols].copy_from_slice(&c);
            scales[r..r + n].copy_from_slice(&sc);
            r += n;
        }
        Ok(true)
    }
}

/// [`upload_stacked`] of 2-D weights, quantized per row for FP8 GEMMs ([`QuantizedWeight`]).
pub fn upload_stacked_e4m3(views: &[View], ctx: &Ctx, s: Stream) -> Result<QuantizedWeight> {
    let first = views.first().ok_or_else(|| Error::Upload {
        name: "(none)".into(),
        reason: "nothing to stack".into(),
    })?;
    let cols = match first.shape {
        [_, c] => *c,
        other => {
            return Err(Error::Upload {
                name: first.name.clone(),
                reason: format!("an FP8 weight is 2-D, not {other:?}"),
            });
        }
    };
    for v in views {
        if v.shape.len() != 2 || v.shape[1] != cols {
            return Err(Error::TensorShape {
                name: v.name.clone(),
                got: v.shape.to_vec(),
                expected: vec![v.shape.first().copied().unwrap_or(0), cols],
            });
        }
    }
    let rows: usize = views.iter().map(|v| v.shape[0]).sum();
    let q = QuantizedWeight {
        codes: Tensor::alloc(ctx, &first.name, DType::E4M3, &[rows, cols])?,
        scales: Tensor::alloc(ctx, &format!("{}.scales", first.name), DType::F32, &[rows])?,
    };
    let mut at = 0;
    for v in views {
        v.write_e4m3_rows(&q, s, at)?;
        at += v.shape[0];
    }
    Ok(q)
}

/// Several `[rows_i, …]` tensors stacked along their first dimension into one new tensor of
/// `dtype` (`[Σ rows_i, …]`: fused projections such as `[q; k; v]`), each written into its
/// rows; the trailing dimensions must agree. Named after the first.
pub fn upload_stacked(views: &[View], ctx: &Ctx, s: Stream, dtype: DType) -> Result<Tensor> {
    let first = views.first().ok_or_else(|| Error::Upload {
        name: "(none)".into(),
        reason: "nothing to stack".into(),
    })?;
    let tail = &first.shape[1..];
    for v in views {
        if v.shape.len() != first.shape.len() || &v.shape[1..] != tail {
            return Err(Error::TensorShape {
                name: v.name.clone(),
                got: v.shape.to_vec(),
                expected: [&[v.shape.first().copied().unwrap_or(0)], tail].concat(),
            });
        }
    }
    let rows: usize = views.iter().map(|v| v.shape[0]).sum();
    let mut shape = first.shape.to_vec();
    shape[0] = rows;
    let t = Tensor::alloc(ctx, &first.name, dtype, &shape)?;
    let mut at = 0;
    for v in views {
        v.write_into(&t, s, at)?;
        at += v.numel();
    }
    Ok(t)
}
