//! Writing a store as one safetensors checkpoint, chosen 2-D weights pre-quantized to E4M3
//! ([`Store::write_quantized`]).

use super::{E4M3_PASS, Store, Stored, View, bad, io, scale_name};
use crate::error::{Error, Result};
use std::collections::HashSet;
use std::io::Write;
use std::path::{Path as FsPath, PathBuf};

/// Bytes of a copied tensor read and written at a time.
const COPY_BYTES: usize = 32 << 20;

/// What [`Store::write_quantized`] wrote.
#[derive(Clone, Debug)]
pub struct Written {
    /// The checkpoint file.
    pub file: PathBuf,
    /// Tensors written (a pre-quantized weight's scales not counted).
    pub tensors: usize,
    /// Weights written as E4M3 codes with their scales.
    pub quantized: usize,
    /// The file's size.
    pub bytes: u64,
    /// The stored size of the tensors written, as they were in the store.
    pub source_bytes: u64,
    /// Files copied from beside the checkpoint (configuration, norm stats, ...).
    pub files_copied: usize,
}

/// One tensor of the file, in the order the data is written.
enum Out<'a> {
    /// As stored.
    Copy(View<'a>),
    /// E4M3 codes (quantized now, or as stored), then their scales.
    Codes(View<'a>),
}

impl Store {
    /// Writes every tensor of the store into `dir/model.safetensors`: the 2-D weights named in
    /// `quantize`, and those already pre-quantized, as E4M3 codes with their rows' scales
    /// ([`Stored::E4M3`]): the codes and scales an FP8 upload of the stored values computes
    /// ([`quantize_rows_e4m3`](frt_kernels::fp8::quantize_rows_e4m3)), so a model loading
    /// either checkpoint holds the same FP8 weights; every other tensor as stored (aliases
    /// once, under their target's name). When the store was opened from a folder, the files
    /// beside its checkpoint (every file but the safetensors and their index: configuration,
    /// norm stats) are copied too. `dir` must be new or empty. The file is written under a
    /// temporary name and renamed when complete; a non-finite value is an error naming its
    /// tensor.
    pub fn write_quantized(&self, quantize: &[&str], dir: &FsPath) -> Result<Written> {
        let folder_err = |reason: &str| Error::ModelFolder {
            dir: dir.to_path_buf(),
            reason: reason.into(),
        };
        if dir.exists() {
            let mut entries = std::fs::read_dir(dir).map_err(io(dir))?;
            if entries.next().is_some() {
                return Err(folder_err("exists and is not empty"));
            }
        }
        let wanted: HashSet<&str> = quantize.iter().copied().collect();
        let outs = self.plan_write(&wanted)?;
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let file = dir.join("model.safetensors");
        let partial = dir.join("model.safetensors.partial");
        let written = write_file(&outs, &partial);
        let (bytes, source_bytes) = match written {
            Ok(b) => b,
            Err(e) => {
                // Nothing half-written is left behind.
                let _ = std::fs::remove_file(&partial);
                return Err(e);
            }
        };
        std::fs::rename(&partial, &file).map_err(io(&file))?;
        let files_copied = if self.origin.is_dir() {
            copy_beside(&self.origin, dir)?
        } else {
            0
        };
        Ok(Written {
            file,
            tensors: outs.len(),
            quantized: outs.iter().filter(|o| matches!(o, Out::Codes(_))).count(),
            bytes,
            source_bytes,
            files_copied,
        })
    }

    /// The tensors to write, in name order, each checked against `quantize`.
    fn plan_write<'a>(&'a self, quantize: &HashSet<&str>) -> Result<Vec<Out<'a>>> {
        let file = &self.origin;
        for name in quantize {
            let e = self
                .entries
                .get(*name)
                .ok_or_else(|| Error::MissingTensor {
                    name: name.to_string(),
                    expected: vec![],
                })?;
            if self.aliases.contains(*name) {
                return Err(bad(
                    file,
                    format!("`{name}` is another tensor's alias: name the tensor itself"),
                ));
            }
            if !matches!(e.shape[..], [r, c] if r > 0 && c > 0) {
                return Err(bad(
                    file,
                    format!("`{name}` is {:?}: only 2-D weights are quantized", e.shape),
                ));
            }
            let sn = scale_name(name);
            if e.scale.is_none() && self.entries.contains_key(&sn) {
                return Err(bad(
                    file,
                    format!("`{name}` would be quantized, but `{sn}` is another tensor"),
                ));
            }
        }
        // Scales are written with their codes.
        let scales: HashSet<&str> = self
            .entries
            .values()
            .filter_map(|e| e.scale.as_deref())
            .collect();
        let mut outs = Vec::new();
        for name in self.names() {
            if self.aliases.contains(name) || scales.contains(name) {
                continue;
            }
            let v = self.view(name)?;
            outs.push(if quantize.contains(name) || v.stored == Stored::E4M3 {
                Out::Codes(v)
            } else {
                Out::Copy(v)
            });
        }
        Ok(outs)
    }
}

impl View<'_> {
    /// This 2-D weight's E4M3 codes, a pass of rows at a time into `put` (quantized per row on
    /// several threads, or as stored); returns their rows' scales.
    fn write_codes(&self, mut put: impl FnMut(&[u8]) -> Result<()>) -> Result<Vec<f32>> {
        let (rows, cols) = (self.shape[0], self.shape[1]);
        let pass_rows = (E4M3_PASS / cols).max(1);
        let mut codes = vec![0u8; pass_rows.min(rows) * cols];
        let mut scales = vec![0f32; rows];
        let mut r = 0;
        while r < rows {
            let n = pass_rows.min(rows - r);
            let out = &mut codes[..n * cols];
            self.e4m3_pass(r, cols, out, &mut scales[r..r + n])?;
            put(out)?;
            r += n;
        }
        Ok(scales)
    }
}

/// Writes the safetensors file of `outs` at `partial`: (its size, the stored size of what it
/// holds).
fn write_file(outs: &[Out], partial: &FsPath) -> Result<(u64, u64)> {
    let header = header(outs)?;
    let mut w = std::io::BufWriter::with_capacity(
        1 << 20,
        std::fs::File::create(partial).map_err(io(partial))?,
    );
    let put =
        |w: &mut std::io::BufWriter<std::fs::File>, b: &[u8]| w.write_all(b).map_err(io(partial));
    put(&mut w, &(header.len() as u64).to_le_bytes())?;
    put(&mut w, &header)?;
    let mut source_bytes = 0u64;
    for out in outs {
        match out {
            Out::Copy(v) => {
                let len = v.stored_len();
                source_bytes += len as u64;
                let mut buf = vec![0u8; COPY_BYTES.min(len)];
                let mut at = 0;
                while at < len {
                    let part = &mut buf[..COPY_BYTES.min(len - at)];
                    if !v.fill_part(at, part, v.stored.dtype())? {
                        return Err(Error::NonFinite {
                            name: v.name.clone(),
                        });
                    }
                    put(&mut w, part)?;
                    at += part.len();
                }
            }
            Out::Codes(v) => {
                source_bytes += v.stored_len() as u64;
                let scales = v.write_codes(|b| put(&mut w, b))?;
                let bytes: Vec<u8> = scales.iter().flat_map(|s| s.to_le_bytes()).collect();
                put(&mut w, &bytes)?;
            }
        }
    }
    let f = w.into_inner().map_err(|e| io(partial)(e.into_error()))?;
    f.sync_all().map_err(io(partial))?;
    let bytes = f.metadata().map_err(io(partial))?.len();
    Ok((bytes, source_bytes))
}

/// The safetensors header of `outs`, written in their order: the JSON, padded with spaces
/// to a multiple of 8 bytes.
fn header(outs: &[Out]) -> Result<Vec<u8>> {
    let mut map = serde_json::Map::new();
    let mut at = 0usize;
    let mut entry = |name: &str, dtype: &str, shape: &[usize], len: usize| {
        map.insert(
            name.to_string(),
            serde_json::json!({ "dtype": dtype, "shape": shape, "data_offsets": [at, at + len] }),
        );
        at += len;
    };
    for out in outs {
        match out {
            Out::Copy(v) => {
                let dtype = match v.stored {
                    Stored::F32 => "F32",
                    Stored::BF16 => "BF16",
                    Stored::F16 => "F16",
                    Stored::E4M3 => unreachable!("written as codes"),
                };
                entry(&v.name, dtype, v.shape, v.stored_len());
            }
            Out::Codes(v) => {
                let rows = v.shape[0];
                entry(&v.name, "F8_E4M3", v.shape, v.numel());
                entry(&scale_name(&v.name), "F32", &[rows], rows * 4);
            }
        }
    }
    map.insert(
        "__metadata__".into(),
        serde_json::json!({ "format": "pt", "frt.quantized": "E4M3 per output feature" }),
    );
    let mut h = serde_json::to_vec(&serde_json::Value::Object(map)).map_err(|e| Error::Upload {
        name: "(safetensors header)".into(),
        reason: e.to_string(),
    })?;
    h.resize(h.len().next_multiple_of(8), b' ');
    Ok(h)
}

/// Copies every file and folder in `from` into `to` but safetensors files and their index;
/// returns the number of files copied.
fn copy_beside(from: &FsPath, to: &FsPath) -> Result<usize> {
    let mut n = 0;
    for e in std::fs::read_dir(from).map_err(io(from))? {
        let e = e.map_err(io(from))?;
        let (src, name) = (e.path(), e.file_name());
        let text = name.to_string_lossy();
        if text.ends_with(".safetensors") || text == "model.safetensors.index.json" {
            continue;
        }
        let dst = to.join(&name);
        if src.is_dir() {
            std::fs::create_dir_all(&dst).map_err(io(&dst))?;
            n += copy_beside(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst).map_err(io(&src))?;
            n += 1;
        }
    }
    Ok(n)
}
