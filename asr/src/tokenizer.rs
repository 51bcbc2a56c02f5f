//! Whisper's byte-level BPE tokenizer, read from `tokenizer.json`: decoding ids to text, and
//! encoding the few strings needed to derive the suppressed-token list the way faster-whisper
//! does.

use crate::error::{Error, Result};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

/// Ids of Whisper's special tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Specials {
    pub eot: u32,
    pub sot: u32,
    pub transcribe: u32,
    pub translate: u32,
    pub sot_prev: u32,
    pub sot_lm: u32,
    pub no_speech: u32,
    pub no_timestamps: u32,
    /// `<|en|>` on multilingual models (English-only models have no language token).
    pub english: Option<u32>,
}

pub struct Tokenizer {
    id_to_token: Vec<Option<String>>,
    token_to_id: HashMap<String, u32>,
    ranks: HashMap<(String, String), usize>,
    byte_to_char: [char; 256],
    char_to_byte: HashMap<char, u8>,
    pub specials: Specials,
}

/// GPT-2's reversible map from bytes to printable characters.
fn bytes_to_unicode() -> [char; 256] {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + n);
            n += 1;
        }
    }
    let mut map = ['\0'; 256];
    for (b, c) in printable.iter().zip(chars) {
        map[*b as usize] = char::from_u32(c).expect("valid code point");
    }
    map
}

impl Tokenizer {
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Tokenizer::from_json(&text)
    }

    /// The largest token id accepted (Whisper's vocabularies hold about 51 900 tokens): the
    /// id table is sized by the largest id, so a bad file never asks for gigabytes.
    pub const MAX_ID: u64 = 1 << 20;

    pub fn from_json(text: &str) -> Result<Tokenizer> {
        let checked_id = |id: u64| {
            if id > Self::MAX_ID {
                return Err(Error::Tokenizer(format!(
                    "token id {id} is implausibly large (at most {})",
                    Self::MAX_ID
                )));
            }
            Ok(id as u32)
        };
        let bad = |r: &str| Error::Tokenizer(r.to_string());
        let v: Value =
            serde_json::from_str(text).map_err(|e| Error::Tokenizer(format!("not JSON: {e}")))?;
        let model = v.get("model").ok_or_else(|| bad("no `model`"))?;
        if model.get("type").and_then(Value::as_str) != Some("BPE") {
            return Err(bad("the model is not BPE"));
        }
        let vocab = model
            .get("vocab")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("no `model.vocab`"))?;
        let mut token_to_id = HashMap::with_capacity(vocab.len() + 128);
        for (tok, id) in vocab {
            let id = id
                .as_u64()
                .ok_or_else(|| bad("a vocabulary id is not a number"))?;
            token_to_id.insert(tok.clone(), checked_id(id)?);
        }
        for added in v
            .get("added_tokens")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let (Some(tok), Some(id)) = (
                added.get("content").and_then(Value::as_str),
                added.get("id").and_then(Value::as_u64),
            ) else {
                return Err(bad("an added token lacks `content` or `id`"));
            };
            token_to_id.insert(tok.to_string(), checked_id(id)?);
        }
        let mut ranks = HashMap::new();
        for (rank, m) in model
            .get("merges")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no `model.merges`"))?
            .iter()
            .enumerate()
        {
            let pair = match m {
                Value::String(s) => s
                    .split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string())),
                Value::Array(a) if a.len() == 2 => a[0]
                    .as_str()
                    .zip(a[1].as_str())
                    .map(|(x, y)| (x.to_string(), y.to_string())),
                _ => None,
            };
            ranks.insert(pair.ok_or_else(|| bad("a merge is not a pair"))?, rank);
        }
        let max_id = token_to_id.values().copied().max().unwrap_or(0) as usize;
        let mut id_to_token = vec![None; max_id + 1];
        for (t, &id) in &token_to_id {
            id_to_token[id as usize] = Some(t.clone());
        }
        let id = |t: &str| {
            token_to_id
                .get(t)
                .copied()
                .ok_or_else(|| Error::Tokenizer(format!("no special token {t}")))
        };
        let specials = Specials {
            eot: id("<|endoftext|>")?,
            sot: id("<|startoftranscript|>")?,
            transcribe: id("<|transcribe|>")?,
            translate: id("<|translate|>")?,
            sot_prev: id("<|startofprev|>")?,
            sot_lm: id("<|startoflm|>")?,
            no_speech: id("<|nospeech|>").or_else(|_| id("<|nocaptions|>"))?,
            no_timestamps: id("<|notimestamps|>")?,
            english: token_to_id.get("<|en|>").copied(),
        };
        let byte_to_char = bytes_to_unicode();
        let char_to_byte = byte_to_char
            .iter()
            .enumerate()
            .map(|(b, c)| (*c, b as u8))
            .collect();
        Ok(Tokenizer {
            id_to_token,
            token_to_id,
            ranks,
            byte_to_char,
            char_to_byte,
            specials,
        })
    }

    /// The text of `ids`, skipping special and timestamp tokens.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            if id >= self.specials.eot {
                continue;
            }
            if let Some(Some(t)) = self.id_to_token.get(id as usize) {
                bytes.extend(t.chars().filter_map(|c| self.char_to_byte.get(&c)));
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// BPE of one pre-token (a string the byte-level pre-tokenizer keeps whole).
    pub fn encode_word(&self, word: &str) -> Vec<u32> {
        let mut parts: Vec<String> = word
            .bytes()
            .map(|b| self.byte_to_char[b as usize].to_string())
            .collect();
        loop {
            let best = (0..parts.len().saturating_sub(1))
                .filter_map(|i| {
                    self.ranks
                        .get(&(parts[i].clone(), parts[i + 1].clone()))
                        .map(|r| (*r, i))
                })
                .min();
            let Some((_, i)) = best else { break };
            let (a, b) = (parts[i].clone(), parts[i + 1].clone());
            let mut merged = Vec::with_capacity(parts.len());
            let mut j = 0;
            while j < parts.len() {
                if j + 1 < parts.len() && parts[j] == a && parts[j + 1] == b {
                    merged.push(format!("{a}{b}"));
                    j += 2;
                } else {
                    merged.push(parts[j].clone());
                    j += 1;
                }
            }
            parts = merged;
        }
        parts
            .iter()
            .filter_map(|p| self.token_to_id.get(p).copied())
            .collect()
    }

    /// The tokens faster-whisper suppresses with `suppress_tokens=[-1]`: symbols that start
    /// non-speech annotations (♪, [, (, ...) plus the task and start-of-sequence tokens.
    pub fn suppressed_tokens(&self) -> Vec<u32> {
        let mut symbols: Vec<String> = "\"#()*+/:;<=>@[\\]^_`{|}~「」『』"
            .chars()
            .map(String::from)
            .collect();
        symbols.extend(
            "<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪"
                .split(' ')
                .map(String::from),
        );
        let misc: Vec<String> = "♩♪♫♬♭♮♯".chars().map(String::from).collect();
        let mut out: Vec<u32> = [" -", " '"]
            .iter()
            .filter_map(|s| self.encode_word(s).first().copied())
            .collect();
        for sym in symbols.iter().chain(&misc) {
            for s in [sym.clone(), format!(" {sym}")] {
                let toks = self.encode_word(&s);
                if toks.len() == 1 || (misc.contains(sym) && !toks.is_empty()) {
                    out.push(toks[0]);
                }
            }
        }
        let sp = self.specials;
        out.extend([sp.transcribe, sp.translate, sp.sot, sp.sot_prev, sp.sot_lm]);
        out.sort_unstable();
        out.dedup();
        out
    }

    pub fn token(&self, id: u32) -> Option<&str> {
        self.id_to_token.get(id as usize).and_then(|t| t.as_deref())
    }
}
