//! openpi's msgpack encoding with numpy arrays (openpi-client `msgpack_numpy.py`), over
//! `rmpv` values: an array is a map `{b"__ndarray__": True, b"data": <bytes>, b"dtype":
//! "<f4", b"shape": [..]}` and a numpy scalar `{b"__npgeneric__": True, b"data": <value>,
//! b"dtype": ".."}` — the keys are msgpack `bin` (Python `bytes`), the dtype a numpy type
//! string. Observation keys are `str`; nested dicts (ALOHA's `images`) are maps.

use rmpv::Value;

/// Deepest nesting a message may have (a malicious message cannot exhaust the stack).
const MAX_DEPTH: usize = 32;

/// A numpy element type the server reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    Bool,
    U8,
    I8,
    I16,
    I32,
    I64,
    U16,
    U32,
    U64,
    F16,
    F32,
    F64,
}

impl Dtype {
    /// A numpy type string (`<f4`, `|u1`, `=f8`, …; little-endian or byte-order free).
    fn parse(s: &str) -> Option<Dtype> {
        let (order, kind) = s.split_at(1.min(s.len()));
        let kind = match order {
            "<" | "|" | "=" => kind,
            _ => s,
        };
        Some(match kind {
            "b1" | "?" => Dtype::Bool,
            "u1" => Dtype::U8,
            "i1" => Dtype::I8,
            "i2" => Dtype::I16,
            "i4" => Dtype::I32,
            "i8" => Dtype::I64,
            "u2" => Dtype::U16,
            "u4" => Dtype::U32,
            "u8" => Dtype::U64,
            "f2" => Dtype::F16,
            "f4" => Dtype::F32,
            "f8" => Dtype::F64,
            _ => return None,
        })
    }

    pub fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::U8 | Dtype::I8 => 1,
            Dtype::I16 | Dtype::U16 | Dtype::F16 => 2,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
            Dtype::I64 | Dtype::U64 | Dtype::F64 => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::F32 | Dtype::F64)
    }
}

/// A numpy array in a message (its bytes borrowed from it).
#[derive(Debug)]
pub struct Array<'a> {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: &'a [u8],
}

impl Array<'_> {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Element `i` as f64.
    pub fn get(&self, i: usize) -> f64 {
        let n = self.dtype.size();
        let b = &self.data[i * n..(i + 1) * n];
        match self.dtype {
            Dtype::Bool | Dtype::U8 => b[0] as f64,
            Dtype::I8 => b[0] as i8 as f64,
            Dtype::I16 => i16::from_le_bytes([b[0], b[1]]) as f64,
            Dtype::U16 => u16::from_le_bytes([b[0], b[1]]) as f64,
            Dtype::I32 => i32::from_le_bytes(b.try_into().expect("4 bytes")) as f64,
            Dtype::U32 => u32::from_le_bytes(b.try_into().expect("4 bytes")) as f64,
            Dtype::I64 => i64::from_le_bytes(b.try_into().expect("8 bytes")) as f64,
            Dtype::U64 => u64::from_le_bytes(b.try_into().expect("8 bytes")) as f64,
            Dtype::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
            Dtype::F32 => f32::from_le_bytes(b.try_into().expect("4 bytes")) as f64,
            Dtype::F64 => f64::from_le_bytes(b.try_into().expect("8 bytes")),
        }
    }
}

/// Reads one message (an error names what is wrong).
pub fn decode(mut bytes: &[u8]) -> Result<Value, String> {
    let v = rmpv::decode::read_value_with_max_depth(&mut bytes, MAX_DEPTH)
        .map_err(|e| format!("not a msgpack message: {e}"))?;
    if !bytes.is_empty() {
        return Err(format!("{} bytes after the message", bytes.len()));
    }
    Ok(v)
}

/// Writes one message.
pub fn encode(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, v).expect("writing to a Vec");
    out
}

/// A map key as text (`str` or `bin` keys).
fn key_text(k: &Value) -> Option<&str> {
    match k {
        Value::String(s) => s.as_str(),
        Value::Binary(b) => std::str::from_utf8(b).ok(),
        _ => None,
    }
}

/// The value under `key` in a map (`str` or `bin` key).
pub fn field<'a>(map: &'a Value, key: &str) -> Option<&'a Value> {
    map.as_map()?
        .iter()
        .find(|(k, _)| key_text(k) == Some(key))
        .map(|(_, v)| v)
}

/// The keys of a map, for error messages.
pub fn keys(map: &Value) -> Vec<String> {
    map.as_map()
        .map(|m| {
            m.iter()
                .filter_map(|(k, _)| key_text(k).map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// `v` as a numpy array: an encoded ndarray, or (for state vectors and scalars) numbers, a
/// list of numbers, or a numpy scalar, as a 1-D f64 array.
pub enum Numbers<'a> {
    Array(Array<'a>),
    Values(Vec<f64>),
}

impl Numbers<'_> {
    pub fn shape(&self) -> Vec<usize> {
        match self {
            Numbers::Array(a) => a.shape.clone(),
            Numbers::Values(v) => vec![v.len()],
        }
    }

    /// Every value as f64, in order.
    pub fn values(&self) -> Vec<f64> {
        match self {
            Numbers::Array(a) => (0..a.numel()).map(|i| a.get(i)).collect(),
            Numbers::Values(v) => v.clone(),
        }
    }
}

fn number(v: &Value) -> Option<f64> {
    match v {
        Value::F32(x) => Some(*x as f64),
        Value::F64(x) => Some(*x),
        Value::Integer(i) => i.as_f64(),
        Value::Boolean(b) => Some(f64::from(u8::from(*b))),
        _ => None,
    }
}

/// Reads `v` as numbers (see [`Numbers`]); an error says what was there.
pub fn numbers(v: &Value) -> Result<Numbers<'_>, String> {
    if let Some(a) = array(v)? {
        return Ok(Numbers::Array(a));
    }
    if field(v, "__npgeneric__").is_some() {
        let x = field(v, "data")
            .and_then(number)
            .ok_or("a numpy scalar without a number")?;
        return Ok(Numbers::Values(vec![x]));
    }
    if let Some(x) = number(v) {
        return Ok(Numbers::Values(vec![x]));
    }
    if let Some(list) = v.as_array() {
        return list
            .iter()
            .map(|x| number(x).ok_or_else(|| "a list with a value that is not a number".into()))
            .collect::<Result<Vec<_>, String>>()
            .map(Numbers::Values);
    }
    Err(format!("{} (expected a numpy array or numbers)", kind(v)))
}

/// `v` as an encoded numpy array, `None` if it is not one; an error if it claims to be one
/// and is malformed.
pub fn array(v: &Value) -> Result<Option<Array<'_>>, String> {
    if field(v, "__ndarray__").is_none() {
        return Ok(None);
    }
    let dtype_s = field(v, "dtype")
        .and_then(|d| {
            d.as_str()
                .or_else(|| d.as_slice().and_then(|b| std::str::from_utf8(b).ok()))
        })
        .ok_or("a numpy array without a dtype")?;
    let dtype = Dtype::parse(dtype_s)
        .ok_or_else(|| format!("a numpy array of dtype `{dtype_s}` (not read)"))?;
    let shape = field(v, "shape")
        .and_then(|s| s.as_array())
        .ok_or("a numpy array without a shape")?
        .iter()
        .map(|d| {
            d.as_u64()
                .map(|d| d as usize)
                .ok_or("a numpy array with a bad shape")
        })
        .collect::<Result<Vec<usize>, &str>>()?;
    let data = field(v, "data")
        .and_then(|d| d.as_slice())
        .ok_or("a numpy array without data bytes")?;
    let numel = shape
        .iter()
        .try_fold(1usize, |a, d| a.checked_mul(*d))
        .ok_or("a numpy array whose shape overflows")?;
    if numel.checked_mul(dtype.size()) != Some(data.len()) {
        return Err(format!(
            "a numpy array of shape {shape:?} and dtype `{dtype_s}` with {} data bytes",
            data.len()
        ));
    }
    Ok(Some(Array { dtype, shape, data }))
}

/// What kind of value `v` is, for error messages.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Nil => "None",
        Value::Boolean(_) => "a bool",
        Value::Integer(_) | Value::F32(_) | Value::F64(_) => "a number",
        Value::String(_) => "a string",
        Value::Binary(_) => "bytes",
        Value::Array(_) => "a list",
        Value::Map(_) => "a dict",
        Value::Ext(..) => "a msgpack extension",
    }
}

/// A float32 array as openpi's packer writes one.
pub fn f32_array(shape: &[usize], values: &[f32]) -> Value {
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    Value::Map(vec![
        (Value::Binary(b"__ndarray__".to_vec()), Value::Boolean(true)),
        (Value::Binary(b"data".to_vec()), Value::Binary(data)),
        (
            Value::Binary(b"dtype".to_vec()),
            Value::String("<f4".into()),
        ),
        (
            Value::Binary(b"shape".to_vec()),
            Value::Array(shape.iter().map(|d| Value::from(*d as u64)).collect()),
        ),
    ])
}

/// A map with text keys.
pub fn map(entries: Vec<(&str, Value)>) -> Value {
    Value::Map(
        entries
            .into_iter()
            .map(|(k, v)| (Value::String(k.into()), v))
            .collect(),
    )
}
