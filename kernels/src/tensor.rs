//! `Tensor`: a typed view (dtype, shape, strides, offset) over an exec `Buffer`.

use crate::DType;
use crate::dtype::{Float, with_float};
use crate::error::{Error, Result};
use frt_exec::{Buffer, Ctx, Stream};
use std::fmt;

/// The most dimensions a tensor has.
pub const MAX_RANK: usize = 6;

/// A view of `shape` elements of `dtype` in a [`Buffer`], at element `offset`, with element
/// `strides`. Cheap to clone (the buffer is shared). Ops check shapes and dtypes when they
/// are enqueued, never while they run.
#[derive(Clone)]
pub struct Tensor {
    buffer: Buffer,
    dtype: DType,
    rank: usize,
    dims: [usize; MAX_RANK],
    strides: [usize; MAX_RANK],
    offset: usize,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor({} {:?} {:?}",
            self.buffer.name(),
            self.dtype,
            self.shape()
        )?;
        if !self.is_contiguous() {
            write!(f, " strides {:?}", self.strides())?;
        }
        if self.offset > 0 {
            write!(f, " +{}", self.offset)?;
        }
        write!(f, ")")
    }
}

fn contiguous_strides(shape: &[usize]) -> [usize; MAX_RANK] {
    let mut st = [0; MAX_RANK];
    let mut acc = 1;
    for i in (0..shape.len()).rev() {
        st[i] = acc;
        acc *= shape[i];
    }
    st
}

/// The most pieces [`Tensor::write_f32_parts`] takes (pieces are gathered on the stack).
pub const MAX_PARTS: usize = 8;

impl Tensor {
    /// A contiguous row-major view of the start of `buffer`.
    pub fn new(buffer: &Buffer, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        Tensor::with_layout(
            buffer,
            dtype,
            shape,
            &contiguous_strides(shape)[..shape.len()],
            0,
        )
    }

    /// A view with explicit element strides and offset; it must lie inside the buffer.
    pub fn with_layout(
        buffer: &Buffer,
        dtype: DType,
        shape: &[usize],
        strides: &[usize],
        offset: usize,
    ) -> Result<Tensor> {
        let op = "Tensor";
        if shape.is_empty() || shape.len() > MAX_RANK || strides.len() != shape.len() {
            return Err(Error::shape(
                op,
                format!(
                    "rank {} (strides {}) outside 1..={MAX_RANK}",
                    shape.len(),
                    strides.len()
                ),
            ));
        }
        if shape.contains(&0) {
            return Err(Error::shape(
                op,
                format!("`{}`: empty dimension in {shape:?}", buffer.name()),
            ));
        }
        let mut last = offset;
        for (d, s) in shape.iter().zip(strides) {
            last = (d - 1)
                .checked_mul(*s)
                .and_then(|x| x.checked_add(last))
                .ok_or_else(|| Error::shape(op, "layout overflows"))?;
        }
        let needed = (last + 1)
            .checked_mul(dtype.size())
            .ok_or_else(|| Error::shape(op, "layout overflows"))?;
        if needed > buffer.bytes() {
            return Err(Error::shape(
                op,
                format!(
                    "`{}` has {} bytes; {dtype:?} {shape:?} (strides {strides:?}, offset {offset}) needs {needed}",
                    buffer.name(),
                    buffer.bytes()
                ),
            ));
        }
        let mut dims = [0; MAX_RANK];
        dims[..shape.len()].copy_from_slice(shape);
        let mut st = [0; MAX_RANK];
        st[..shape.len()].copy_from_slice(strides);
        Ok(Tensor {
            buffer: buffer.clone(),
            dtype,
            rank: shape.len(),
            dims,
            strides: st,
            offset,
        })
    }

    /// Allocates a buffer for a contiguous tensor.
    pub fn alloc(ctx: &Ctx, name: &str, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        let n: usize = shape.iter().product();
        let b = Buffer::alloc(ctx, name, n.max(1) * dtype.size())?;
        Tensor::new(&b, dtype, shape)
    }

    pub fn buffer(&self) -> &Buffer {
        &self.buffer
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn shape(&self) -> &[usize] {
        &self.dims[..self.rank]
    }
    pub fn strides(&self) -> &[usize] {
        &self.strides[..self.rank]
    }
    pub fn offset(&self) -> usize {
        self.offset
    }
    pub fn rank(&self) -> usize {
        self.rank
    }
    pub fn dim(&self, i: usize) -> usize {
        self.dims[i]
    }
    pub fn numel(&self) -> usize {
        self.shape().iter().product()
    }
    pub fn name(&self) -> &str {
        self.buffer.name()
    }

    /// The address of the first element (device address on CUDA, host address on host).
    pub fn ptr(&self) -> u64 {
        self.buffer.ptr() + (self.offset * self.dtype.size()) as u64
    }

    pub fn is_contiguous(&self) -> bool {
        self.strides() == &contiguous_strides(self.shape())[..self.rank]
    }

    /// The same memory with another contiguous shape of as many elements.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if !self.is_contiguous() || shape.iter().product::<usize>() != self.numel() {
            return Err(Error::shape(
                "reshape",
                format!("{self:?} cannot be viewed as {shape:?}"),
            ));
        }
        Tensor::with_layout(
            &self.buffer,
            self.dtype,
            shape,
            &contiguous_strides(shape)[..shape.len()],
            self.offset,
        )
    }

    /// Elements `start..start + len` of dimension `dim`.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Tensor> {
        if dim >= self.rank || len == 0 || start + len > self.dims[dim] {
            return Err(Error::shape(
                "narrow",
                format!("{self:?}: dim {dim} range {start}..{}", start + len),
            ));
        }
        let mut shape = self.dims;
        shape[dim] = len;
        Tensor::with_layout(
            &self.buffer,
            self.dtype,
            &shape[..self.rank],
            self.strides(),
            self.offset + start * self.strides[dim],
        )
    }

    pub(crate) fn expect_dtype(
        &self,
        op: &'static str,
        arg: &'static str,
        want: DType,
    ) -> Result<()> {
        if self.dtype == want {
            Ok(())
        } else {
            Err(Error::DType {
                op,
                arg,
                got: self.dtype,
                expected: want.name(),
            })
        }
    }

    pub(crate) fn expect_float(&self, op: &'static str, arg: &'static str) -> Result<()> {
        if self.dtype.is_float() {
            Ok(())
        } else {
            Err(Error::DType {
                op,
                arg,
                got: self.dtype,
                expected: "f32, bf16 or f16",
            })
        }
    }

    pub(crate) fn expect_contiguous(&self, op: &'static str) -> Result<()> {
        if self.is_contiguous() {
            Ok(())
        } else {
            Err(Error::shape(op, format!("{self:?} must be contiguous")))
        }
    }

    /// Writes an f32 tensor from at most 8 pieces (`MAX_PARTS`) laid one after another (`numel`
    /// values in all): one staging copy and one device copy, no allocation (inputs written
    /// every inference).
    pub fn write_f32_parts(&self, s: Stream, parts: &[&[f32]]) -> Result<()> {
        self.expect_contiguous("write_f32_parts")?;
        let n: usize = parts.iter().map(|p| p.len()).sum();
        if self.dtype != DType::F32 || n != self.numel() {
            return Err(Error::shape(
                "write_f32_parts",
                format!("{n} f32 values for {self:?}"),
            ));
        }
        let mut bytes: [&[u8]; MAX_PARTS] = [&[]; MAX_PARTS];
        if parts.len() > MAX_PARTS {
            return Err(Error::shape(
                "write_f32_parts",
                format!("{} pieces (at most {})", parts.len(), bytes.len()),
            ));
        }
        for (b, p) in bytes.iter_mut().zip(parts) {
            // SAFETY: plain numbers, no padding.
            *b = unsafe { std::slice::from_raw_parts(p.as_ptr() as *const u8, p.len() * 4) };
        }
        let at = self.offset * self.dtype.size();
        Ok(self.buffer.upload_parts(s, at, &bytes[..parts.len()])?)
    }

    /// Writes f32 values, converted to the tensor's float dtype (contiguous tensors; other
    /// dtypes than f32 allocate the converted copy: for set-up and tests).
    pub fn write_f32(&self, s: Stream, values: &[f32]) -> Result<()> {
        self.expect_contiguous("write_f32")?;
        self.expect_float("write_f32", "tensor")?;
        if values.len() != self.numel() {
            return Err(Error::shape(
                "write_f32",
                format!("{} values for {self:?}", values.len()),
            ));
        }
        if self.dtype == DType::F32 {
            return self.write_f32_parts(s, &[values]);
        }
        let at = self.offset * self.dtype.size();
        with_float!(self.dtype, T, {
            let v: Vec<T> = values.iter().map(|&x| T::from_f32(x)).collect();
            // SAFETY: plain numbers, no padding.
            let bytes = unsafe {
                std::slice::from_raw_parts(
                    v.as_ptr() as *const u8,
                    v.len() * std::mem::size_of::<T>(),
                )
            };
            Ok(self.buffer.upload(s, at, bytes)?)
        })
    }

    /// Reads the values as f32 (contiguous float tensors; allocates).
    pub fn read_f32(&self, s: Stream) -> Result<Vec<f32>> {
        let (mut raw, mut out) = (Vec::new(), Vec::new());
        self.read_f32_into(s, &mut raw, &mut out)?;
        Ok(out)
    }

    /// [`read_f32`](Self::read_f32) into `out` (resized to the values), the bytes staged in
    /// `raw`: both keep their capacity, so that reading many tensors in turn allocates (and
    /// faults in fresh pages) only for the largest.
    pub fn read_f32_into(&self, s: Stream, raw: &mut Vec<u8>, out: &mut Vec<f32>) -> Result<()> {
        self.expect_contiguous("read_f32")?;
        self.expect_float("read_f32", "tensor")?;
        raw.resize(self.numel() * self.dtype.size(), 0);
        self.buffer
            .download(s, self.offset * self.dtype.size(), raw)?;
        out.clear();
        with_float!(self.dtype, T, {
            out.extend(raw.chunks_exact(std::mem::size_of::<T>()).map(|c| {
                // SAFETY: `c` holds exactly one T, read unaligned.
                unsafe { std::ptr::read_unaligned(c.as_ptr() as *const T) }.to_f32()
            }))
        });
        Ok(())
    }

    /// Writes i32 values (contiguous i32 tensors).
    pub fn write_i32(&self, s: Stream, values: &[i32]) -> Result<()> {
        self.expect_contiguous("write_i32")?;
        self.expect_dtype("write_i32", "tensor", DType::I32)?;
        if values.len() != self.numel() {
            return Err(Error::shape(
                "write_i32",
                format!("{} values for {self:?}", values.len()),
            ));
        }
        Ok(self.buffer.write(s, self.offset, values)?)
    }

    /// Reads i32 values (contiguous i32 tensors).
    pub fn read_i32(&self, s: Stream) -> Result<Vec<i32>> {
        self.expect_contiguous("read_i32")?;
        self.expect_dtype("read_i32", "tensor", DType::I32)?;
        let mut v = vec![0i32; self.numel()];
        self.buffer.read(s, self.offset, &mut v)?;
        Ok(v)
    }

    /// Writes the bytes of a contiguous tensor of a one-byte dtype (u8, e4m3 codes).
    pub fn write_bytes(&self, s: Stream, values: &[u8]) -> Result<()> {
        self.expect_contiguous("write_bytes")?;
        if self.dtype.size() != 1 || values.len() != self.numel() {
            return Err(Error::shape(
                "write_bytes",
                format!("{} bytes for {self:?} (a one-byte dtype)", values.len()),
            ));
        }
        Ok(self.buffer.write(s, self.offset, values)?)
    }

    /// Reads the bytes of a contiguous tensor of a one-byte dtype (u8, e4m3 codes).
    pub fn read_bytes(&self, s: Stream) -> Result<Vec<u8>> {
        self.expect_contiguous("read_bytes")?;
        if self.dtype.size() != 1 {
            return Err(Error::shape(
                "read_bytes",
                format!("{self:?} is not of a one-byte dtype"),
            ));
        }
        let mut v = vec![0u8; self.numel()];
        self.buffer.read(s, self.offset, &mut v)?;
        Ok(v)
    }
}
