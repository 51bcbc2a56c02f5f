//! XCDR1 (classic CDR), little-endian, as ROS 2 middlewares put messages on the wire: a
//! 4-byte encapsulation header (`00 01 00 00`, CDR_LE), then the fields in order, each primitive
//! aligned to its size (at most 8) counted from the end of the header; strings are a u32 length
//! (with the terminating NUL), the bytes and the NUL; sequences a u32 count and the elements;
//! fixed arrays the elements only.

/// Why a message could not be decoded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CdrError {
    #[error("message too short: {need} bytes needed at offset {at}, {len} in total")]
    Short { at: usize, need: usize, len: usize },
    #[error("unsupported encapsulation {0:02x?} (CDR little-endian expected)")]
    Encapsulation([u8; 2]),
    #[error("string at offset {at}: {problem}")]
    BadString { at: usize, problem: &'static str },
    #[error("sequence of {count} elements at offset {at} is longer than the message")]
    Count { at: usize, count: u32 },
    #[error("bool at offset {at} is {value} (0 or 1 expected)")]
    Bool { at: usize, value: u8 },
}

/// Builds one serialized message.
pub struct CdrWriter {
    buf: Vec<u8>,
}

impl Default for CdrWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl CdrWriter {
    pub fn new() -> CdrWriter {
        CdrWriter {
            buf: vec![0x00, 0x01, 0x00, 0x00],
        }
    }

    /// Reuses `buf` (cleared) as the output.
    pub fn with_buffer(mut buf: Vec<u8>) -> CdrWriter {
        buf.clear();
        buf.extend_from_slice(&[0x00, 0x01, 0x00, 0x00]);
        CdrWriter { buf }
    }

    pub fn finish(self) -> Vec<u8> {
        self.buf
    }

    fn align(&mut self, n: usize) {
        let pos = self.buf.len() - 4;
        let pad = (n - pos % n) % n;
        self.buf.resize(self.buf.len() + pad, 0);
    }

    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub fn i8(&mut self, v: i8) {
        self.buf.push(v as u8);
    }
    pub fn bool(&mut self, v: bool) {
        self.buf.push(v as u8);
    }
    pub fn i16(&mut self, v: i16) {
        self.align(2);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u16(&mut self, v: u16) {
        self.align(2);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i32(&mut self, v: i32) {
        self.align(4);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.align(4);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.align(8);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn f32(&mut self, v: f32) {
        self.align(4);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn f64(&mut self, v: f64) {
        self.align(8);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn string(&mut self, s: &str) {
        self.u32(s.len() as u32 + 1);
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
    }
    /// A sequence length.
    pub fn len(&mut self, n: usize) {
        self.u32(n as u32);
    }
    pub fn bytes(&mut self, v: &[u8]) {
        self.len(v.len());
        self.buf.extend_from_slice(v);
    }
    pub fn i8s(&mut self, v: &[i8]) {
        self.len(v.len());
        self.buf.extend(v.iter().map(|x| *x as u8));
    }
    pub fn i16s(&mut self, v: &[i16]) {
        self.len(v.len());
        if !v.is_empty() {
            self.align(2);
        }
        for x in v {
            self.buf.extend_from_slice(&x.to_le_bytes());
        }
    }
    pub fn i32s(&mut self, v: &[i32]) {
        self.len(v.len());
        for x in v {
            self.buf.extend_from_slice(&x.to_le_bytes());
        }
    }
    pub fn f32s(&mut self, v: &[f32]) {
        self.len(v.len());
        for x in v {
            self.buf.extend_from_slice(&x.to_le_bytes());
        }
    }
    pub fn f64s(&mut self, v: &[f64]) {
        self.len(v.len());
        if !v.is_empty() {
            self.align(8);
        }
        for x in v {
            self.buf.extend_from_slice(&x.to_le_bytes());
        }
    }
    pub fn strings(&mut self, v: &[String]) {
        self.len(v.len());
        for s in v {
            self.string(s);
        }
    }
}

/// Reads one serialized message; every read is bounds-checked.
pub struct CdrReader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Where the aligned stream starts (after the encapsulation header, if any).
    base: usize,
}

impl<'a> CdrReader<'a> {
    /// Checks the encapsulation header (CDR_LE; the options bytes are ignored).
    pub fn new(buf: &'a [u8]) -> Result<CdrReader<'a>, CdrError> {
        if buf.len() < 4 {
            return Err(CdrError::Short {
                at: 0,
                need: 4,
                len: buf.len(),
            });
        }
        if buf[0..2] != [0x00, 0x01] {
            return Err(CdrError::Encapsulation([buf[0], buf[1]]));
        }
        Ok(CdrReader {
            buf,
            pos: 4,
            base: 4,
        })
    }

    /// Reads a CDR little-endian body whose encapsulation header a middleware has already
    /// consumed (and checked).
    pub fn body(buf: &'a [u8]) -> CdrReader<'a> {
        CdrReader {
            buf,
            pos: 0,
            base: 0,
        }
    }

    fn align(&mut self, n: usize) {
        let rel = self.pos - self.base;
        self.pos += (n - rel % n) % n;
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], CdrError> {
        if self.pos + n > self.buf.len() {
            return Err(CdrError::Short {
                at: self.pos,
                need: n,
                len: self.buf.len(),
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn arr<const N: usize>(&mut self) -> Result<[u8; N], CdrError> {
        self.align(N);
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    pub fn u8(&mut self) -> Result<u8, CdrError> {
        Ok(self.take(1)?[0])
    }
    pub fn i8(&mut self) -> Result<i8, CdrError> {
        Ok(self.take(1)?[0] as i8)
    }
    pub fn bool(&mut self) -> Result<bool, CdrError> {
        let at = self.pos;
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(CdrError::Bool { at, value }),
        }
    }
    pub fn i16(&mut self) -> Result<i16, CdrError> {
        Ok(i16::from_le_bytes(self.arr()?))
    }
    pub fn u16(&mut self) -> Result<u16, CdrError> {
        Ok(u16::from_le_bytes(self.arr()?))
    }
    pub fn i32(&mut self) -> Result<i32, CdrError> {
        Ok(i32::from_le_bytes(self.arr()?))
    }
    pub fn u32(&mut self) -> Result<u32, CdrError> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    pub fn u64(&mut self) -> Result<u64, CdrError> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    pub fn f32(&mut self) -> Result<f32, CdrError> {
        Ok(f32::from_le_bytes(self.arr()?))
    }
    pub fn f64(&mut self) -> Result<f64, CdrError> {
        Ok(f64::from_le_bytes(self.arr()?))
    }
    pub fn string(&mut self) -> Result<String, CdrError> {
        let n = self.u32()? as usize;
        let at = self.pos;
        if n == 0 {
            // Some writers send an empty string as length 0.
            return Ok(String::new());
        }
        let b = self.take(n)?;
        if b[n - 1] != 0 {
            return Err(CdrError::BadString {
                at,
                problem: "no terminating NUL",
            });
        }
        String::from_utf8(b[..n - 1].to_vec()).map_err(|_| CdrError::BadString {
            at,
            problem: "not UTF-8",
        })
    }
    /// A sequence length, checked against what is left (each element at least `min` bytes).
    pub fn len(&mut self, min: usize) -> Result<usize, CdrError> {
        let at = self.pos;
        let count = self.u32()?;
        if (count as usize).saturating_mul(min.max(1)) > self.buf.len() - self.pos {
            return Err(CdrError::Count { at, count });
        }
        Ok(count as usize)
    }
    pub fn bytes(&mut self) -> Result<Vec<u8>, CdrError> {
        let n = self.len(1)?;
        Ok(self.take(n)?.to_vec())
    }
    pub fn i8s(&mut self) -> Result<Vec<i8>, CdrError> {
        Ok(self.bytes()?.into_iter().map(|b| b as i8).collect())
    }
    pub fn i16s(&mut self) -> Result<Vec<i16>, CdrError> {
        let n = self.len(2)?;
        if n > 0 {
            self.align(2);
        }
        let b = self.take(n * 2)?;
        Ok(b.chunks_exact(2)
            .map(|c| i16::from_le_bytes([c[0], c[1]]))
            .collect())
    }
    pub fn i32s(&mut self) -> Result<Vec<i32>, CdrError> {
        let n = self.len(4)?;
        let b = self.take(n * 4)?;
        Ok(b.chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().expect("4")))
            .collect())
    }
    pub fn f32s(&mut self) -> Result<Vec<f32>, CdrError> {
        let n = self.len(4)?;
        let b = self.take(n * 4)?;
        Ok(b.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4")))
            .collect())
    }
    pub fn f64s(&mut self) -> Result<Vec<f64>, CdrError> {
        let n = self.len(8)?;
        if n > 0 {
            self.align(8);
        }
        let b = self.take(n * 8)?;
        Ok(b.chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8")))
            .collect())
    }
    pub fn strings(&mut self) -> Result<Vec<String>, CdrError> {
        let n = self.len(5)?;
        (0..n).map(|_| self.string()).collect()
    }
}
