//! The prompt tokenizer: a Hugging Face `tokenizer.json` of the SentencePiece-BPE kind
//! (PaliGemma's and Gemma's), encoded as the `tokenizers` library encodes it.
//!
//! What is supported is what those files use, and anything else is refused by name when the
//! file is loaded rather than encoded differently:
//!
//! * added tokens, matched leftmost-longest on the raw text (as `tokenizers` does for tokens
//!   that are not `normalized`; special ones included, as `encode` does by default);
//! * normalizers `Replace` (string patterns), `Prepend`, and `Sequence` of those;
//! * pre-tokenizers none, `Split` on a string, `Metaspace`, and `Sequence` of those;
//! * a `BPE` model with `byte_fallback` (`<0xXX>` pieces), `unk_token` and `fuse_unk`,
//!   `ignore_merges`, merges as `"a b"` strings or `["a", "b"]` pairs.
//!
//! The BOS token is not added by [`Tokenizer::encode`]; [`pi05_tokens`] adds it as openpi's
//! PaliGemma tokenizer does (`add_bos=True`).

use crate::error::{Error, Result};
use crate::inputs::{write_pi0_task, write_pi05_prompt};
use serde::Deserialize;
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

#[derive(Deserialize)]
struct File {
    #[serde(default)]
    added_tokens: Vec<AddedToken>,
    normalizer: Option<Value>,
    pre_tokenizer: Option<Value>,
    model: Model,
}

#[derive(Deserialize)]
struct AddedToken {
    id: u32,
    content: String,
    #[serde(default)]
    single_word: bool,
    #[serde(default)]
    lstrip: bool,
    #[serde(default)]
    rstrip: bool,
    #[serde(default)]
    normalized: bool,
}

#[derive(Deserialize)]
struct Model {
    #[serde(rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    dropout: Option<f64>,
    unk_token: Option<String>,
    #[serde(default)]
    continuing_subword_prefix: Option<String>,
    #[serde(default)]
    end_of_word_suffix: Option<String>,
    #[serde(default)]
    fuse_unk: bool,
    #[serde(default)]
    byte_fallback: bool,
    #[serde(default)]
    ignore_merges: bool,
    vocab: HashMap<String, u32>,
    merges: Vec<Merge>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Merge {
    Joined(String),
    Pair(String, String),
}

#[derive(Clone, Debug)]
enum Normalize {
    Replace(String, String),
    Prepend(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Behavior {
    Removed,
    Isolated,
    MergedWithPrevious,
    MergedWithNext,
    Contiguous,
}

#[derive(Clone, Debug)]
enum PreTokenize {
    Split {
        pattern: String,
        behavior: Behavior,
    },
    Metaspace {
        replacement: char,
        prepend: Prepend,
        split: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Prepend {
    Always,
    First,
    Never,
}

/// The most the normalizers of an accepted tokenizer may grow a text (see [`Tokenizer::parse`]).
const MAX_NORMALIZER_GROWTH: f64 = 16.0;

/// A loaded `tokenizer.json` (see the module docs).
pub struct Tokenizer {
    path: PathBuf,
    pieces: Vec<Option<String>>,
    vocab: HashMap<String, u32>,
    /// `(left, right)` → `(rank, merged)`.
    merges: HashMap<(u32, u32), (u32, u32), PairHash>,
    bytes: Option<Box<[u32; 256]>>,
    unk: Option<u32>,
    fuse_unk: bool,
    ignore_merges: bool,
    normalizers: Vec<Normalize>,
    pre_tokenizers: Vec<PreTokenize>,
    /// Added tokens by first character, longest first.
    added: HashMap<char, Vec<(String, u32)>>,
    bos: Option<u32>,
    /// Unique to this tokenizer in the process (what a [`PromptScratch`] remembers it by).
    id: u64,
}

static NEXT_TOKENIZER_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Tokenizer {
    /// Reads and checks a `tokenizer.json`.
    pub fn load(path: &Path) -> Result<Tokenizer> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Tokenizer::parse(&text, path)
    }

    /// Parses the text of a `tokenizer.json` (`path` names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Tokenizer> {
        let bad = |reason: String| Error::BadTokenizer {
            path: path.to_path_buf(),
            reason,
        };
        let file: File =
            serde_json::from_str(text).map_err(|e| bad(format!("not a tokenizer.json: {e}")))?;
        let m = file.model;
        match m.kind.as_deref() {
            Some("BPE") | None => {}
            Some(other) => {
                return Err(bad(format!("model type `{other}` (only BPE is supported)")));
            }
        }
        if m.dropout.is_some_and(|d| d > 0.0) {
            return Err(bad("BPE dropout is not supported".into()));
        }
        if m.continuing_subword_prefix
            .as_deref()
            .is_some_and(|s| !s.is_empty())
            || m.end_of_word_suffix
                .as_deref()
                .is_some_and(|s| !s.is_empty())
        {
            return Err(bad(
                "subword prefixes/suffixes are not supported (not a SentencePiece-BPE tokenizer)"
                    .into(),
            ));
        }
        if m.vocab.is_empty() {
            return Err(bad("empty vocabulary".into()));
        }
        let mut vocab = m.vocab;
        for a in &file.added_tokens {
            if a.single_word || a.lstrip || a.rstrip || a.normalized {
                return Err(bad(format!(
                    "added token {:?} uses single_word/lstrip/rstrip/normalized (not supported)",
                    a.content
                )));
            }
            if a.content.is_empty() {
                return Err(bad(format!("added token {} is empty", a.id)));
            }
            vocab.entry(a.content.clone()).or_insert(a.id);
        }
        // Ids of the vocabulary and of the added tokens (an added token may repeat a piece of
        // the vocabulary under another id).
        let size = vocab
            .values()
            .chain(file.added_tokens.iter().map(|a| &a.id))
            .max()
            .map_or(0, |m| *m as usize + 1);
        if size > 16 << 20 {
            return Err(bad(format!("token id {} is implausibly large", size - 1)));
        }
        let mut pieces = vec![None; size];
        for (p, &id) in &vocab {
            pieces[id as usize] = Some(p.clone());
        }
        for a in &file.added_tokens {
            pieces[a.id as usize] = Some(a.content.clone());
        }
        let mut merges = HashMap::with_capacity_and_hasher(m.merges.len(), PairHash);
        for (rank, merge) in m.merges.iter().enumerate() {
            let (a, b) = match merge {
                Merge::Pair(a, b) => (a.as_str(), b.as_str()),
                Merge::Joined(s) => s
                    .split_once(' ')
                    .ok_or_else(|| bad(format!("merge {rank} ({s:?}) is not `a b`")))?,
            };
            let id = |p: &str| {
                vocab
                    .get(p)
                    .copied()
                    .ok_or_else(|| bad(format!("merge {rank} names {p:?}, not in the vocabulary")))
            };
            let merged = id(&format!("{a}{b}"))?;
            merges
                .entry((id(a)?, id(b)?))
                .or_insert((rank as u32, merged));
        }
        let bytes = if m.byte_fallback {
            let mut t = Box::new([0u32; 256]);
            for (b, slot) in t.iter_mut().enumerate() {
                *slot = *vocab.get(&format!("<0x{b:02X}>")).ok_or_else(|| {
                    bad(format!(
                        "byte_fallback is set but <0x{b:02X}> is not in the vocabulary"
                    ))
                })?;
            }
            Some(t)
        } else {
            None
        };
        let unk = match &m.unk_token {
            Some(u) => Some(
                *vocab
                    .get(u)
                    .ok_or_else(|| bad(format!("unk_token {u:?} is not in the vocabulary")))?,
            ),
            None => None,
        };
        let mut normalizers = Vec::new();
        if let Some(n) = &file.normalizer {
            parse_normalizer(n, &mut normalizers).map_err(bad)?;
        }
        // How much the normalizers can grow a text at most: bounded, so that no tokenizer
        // file makes a prompt grow to gigabytes (SentencePiece's `▁` for a space: 3-fold).
        let mut growth = 1.0f64;
        for n in &normalizers {
            if let Normalize::Replace(from, to) = n {
                if from.is_empty() {
                    return Err(bad("normalizer Replace with an empty pattern".into()));
                }
                growth *= (to.len() as f64 / from.len() as f64).max(1.0);
            }
        }
        if growth > MAX_NORMALIZER_GROWTH {
            return Err(bad(format!(
                "the normalizers may grow a text {growth:.0}-fold (at most {MAX_NORMALIZER_GROWTH})"
            )));
        }
        let mut pre_tokenizers = Vec::new();
        if let Some(p) = &file.pre_tokenizer {
            parse_pre_tokenizer(p, &mut pre_tokenizers).map_err(bad)?;
        }
        let mut added: HashMap<char, Vec<(String, u32)>> = HashMap::new();
        for a in &file.added_tokens {
            let first = a.content.chars().next().expect("checked non-empty");
            added
                .entry(first)
                .or_default()
                .push((a.content.clone(), a.id));
        }
        for v in added.values_mut() {
            v.sort_by_key(|x| std::cmp::Reverse(x.0.len()));
        }
        let bos = vocab.get("<bos>").or_else(|| vocab.get("<s>")).copied();
        Ok(Tokenizer {
            path: path.to_path_buf(),
            pieces,
            vocab,
            merges,
            bytes,
            unk,
            fuse_unk: m.fuse_unk,
            ignore_merges: m.ignore_merges,
            normalizers,
            pre_tokenizers,
            added,
            bos,
            id: NEXT_TOKENIZER_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        })
    }

    /// Ids `0..vocab_size()` may occur.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// The beginning-of-sequence token (`<bos>`, or `<s>`), if the vocabulary has one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The id of a piece, if the vocabulary has it.
    pub fn token_id(&self, piece: &str) -> Option<u32> {
        self.vocab.get(piece).copied()
    }

    /// Encodes `text` (no BOS/EOS added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        self.encode_into(text, &mut out, &mut EncodeScratch::default())?;
        Ok(out)
    }

    /// Appends the ids of `text` to `out`, with `scratch`'s buffers reused: once they have
    /// held a text of this size, a tokenizer without pre-tokenizers (PaliGemma's) allocates
    /// nothing.
    pub fn encode_into(
        &self,
        text: &str,
        out: &mut Vec<u32>,
        scratch: &mut EncodeScratch,
    ) -> Result<()> {
        let mut rest = text;
        let mut at_start = true;
        let mut i = 0;
        while i < rest.len() {
            let c = rest[i..].chars().next().expect("in bounds");
            let hit = self.added.get(&c).and_then(|cands| {
                cands
                    .iter()
                    .find(|(content, _)| rest[i..].starts_with(content.as_str()))
            });
            match hit {
                Some((content, id)) => {
                    self.encode_plain(&rest[..i], at_start, out, scratch)?;
                    at_start = false;
                    out.push(*id);
                    rest = &rest[i + content.len()..];
                    i = 0;
                }
                None => i += c.len_utf8(),
            }
        }
        self.encode_plain(rest, at_start, out, scratch)
    }

    /// Text between added tokens: normalize, pre-tokenize, BPE each word.
    fn encode_plain(
        &self,
        text: &str,
        at_start: bool,
        out: &mut Vec<u32>,
        scratch: &mut EncodeScratch,
    ) -> Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        let EncodeScratch {
            text: s,
            tmp,
            syms,
            merging,
        } = scratch;
        s.clear();
        s.push_str(text);
        for n in &self.normalizers {
            tmp.clear();
            match n {
                Normalize::Replace(from, to) => {
                    let mut last = 0;
                    for (at, _) in s.match_indices(from.as_str()) {
                        tmp.push_str(&s[last..at]);
                        tmp.push_str(to);
                        last = at + from.len();
                    }
                    tmp.push_str(&s[last..]);
                }
                Normalize::Prepend(p) => {
                    tmp.push_str(p);
                    tmp.push_str(s);
                }
            }
            std::mem::swap(s, tmp);
        }
        if self.pre_tokenizers.is_empty() {
            return self.bpe(s, out, syms, merging);
        }
        let mut words = vec![s.clone()];
        for p in &self.pre_tokenizers {
            words = words
                .iter()
                .enumerate()
                .flat_map(|(i, w)| pre_tokenize(p, w, at_start && i == 0))
                .collect();
        }
        for w in &words {
            self.bpe(w, out, syms, merging)?;
        }
        Ok(())
    }

    fn bpe(
        &self,
        word: &str,
        out: &mut Vec<u32>,
        syms: &mut Vec<u32>,
        merging: &mut Merging,
    ) -> Result<()> {
        if word.is_empty() {
            return Ok(());
        }
        if self.ignore_merges
            && let Some(id) = self.vocab.get(word)
        {
            out.push(*id);
            return Ok(());
        }
        // Initial symbols: characters, or their UTF-8 bytes, or unk.
        syms.clear();
        let mut buf = [0u8; 4];
        for c in word.chars() {
            let cs: &str = c.encode_utf8(&mut buf);
            if let Some(id) = self.vocab.get(cs) {
                syms.push(*id);
            } else if let Some(bytes) = &self.bytes {
                syms.extend(cs.bytes().map(|b| bytes[b as usize]));
            } else if let Some(unk) = self.unk {
                if !(self.fuse_unk && syms.last() == Some(&unk)) {
                    syms.push(unk);
                }
            } else {
                return Err(Error::BadInput {
                    what: "prompt".into(),
                    reason: format!(
                        "character {c:?} has no token in {} (no byte fallback, no unk)",
                        self.path.display()
                    ),
                });
            }
        }
        // Merge the lowest-ranked adjacent pair (leftmost on ties) until none applies, as
        // `tokenizers` does: candidate pairs in a heap ordered by (rank, position), symbols in
        // a linked list; a popped pair no longer there is skipped.
        let Merging { next, prev, heap } = merging;
        let n = syms.len();
        next.clear();
        next.extend((1..=n).map(|i| i as u32));
        prev.clear();
        prev.extend((0..n).map(|i| (i as u32).wrapping_sub(1)));
        heap.clear();
        let rank_at = |syms: &[u32], next: &[u32], i: usize| -> Option<(u32, u32)> {
            let j = next[i] as usize;
            if j >= n || syms[i] == GONE {
                return None;
            }
            self.merges.get(&(syms[i], syms[j])).copied()
        };
        for i in 0..n.saturating_sub(1) {
            if let Some((r, _)) = rank_at(syms, next, i) {
                heap.push(std::cmp::Reverse((r, i as u32)));
            }
        }
        while let Some(std::cmp::Reverse((r, i))) = heap.pop() {
            let i = i as usize;
            let Some((rank, merged)) = rank_at(syms, next, i) else {
                continue;
            };
            if rank != r {
                continue;
            }
            let j = next[i] as usize;
            syms[i] = merged;
            syms[j] = GONE;
            next[i] = next[j];
            if (next[i] as usize) < n {
                prev[next[i] as usize] = i as u32;
            }
            let before = prev[i] as usize;
            if before < n
                && let Some((r, _)) = rank_at(syms, next, before)
            {
                heap.push(std::cmp::Reverse((r, before as u32)));
            }
            if let Some((r, _)) = rank_at(syms, next, i) {
                heap.push(std::cmp::Reverse((r, i as u32)));
            }
        }
        out.extend(syms.iter().copied().filter(|s| *s != GONE));
        Ok(())
    }

    /// Decodes ids to text (pieces joined, `▁` as a space, byte pieces as UTF-8). For logs.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            let Some(Some(p)) = self.pieces.get(id as usize) else {
                continue;
            };
            if let Some(b) = byte_piece(p) {
                bytes.push(b);
            } else {
                bytes.extend_from_slice(p.replace('▁', " ").as_bytes());
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

fn byte_piece(p: &str) -> Option<u8> {
    let hex = p.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

fn kind(v: &Value) -> &str {
    v.get("type").and_then(Value::as_str).unwrap_or("?")
}

fn string_pattern(v: &Value, what: &str) -> std::result::Result<String, String> {
    match v.get("pattern") {
        Some(p) => match p.get("String").and_then(Value::as_str) {
            Some(s) => Ok(s.to_string()),
            None => Err(format!(
                "{what} with a non-string (regex) pattern is not supported"
            )),
        },
        None => Err(format!("{what} without a pattern")),
    }
}

fn parse_normalizer(v: &Value, out: &mut Vec<Normalize>) -> std::result::Result<(), String> {
    match kind(v) {
        "Sequence" => {
            for n in v
                .get("normalizers")
                .and_then(Value::as_array)
                .ok_or("normalizer Sequence without `normalizers`")?
            {
                parse_normalizer(n, out)?;
            }
        }
        "Replace" => {
            let from = string_pattern(v, "normalizer Replace")?;
            let to = v
                .get("content")
                .and_then(Value::as_str)
                .ok_or("normalizer Replace without `content`")?;
            out.push(Normalize::Replace(from, to.to_string()));
        }
        "Prepend" => {
            let p = v
                .get("prepend")
                .and_then(Value::as_str)
                .ok_or("normalizer Prepend without `prepend`")?;
            out.push(Normalize::Prepend(p.to_string()));
        }
        other => return Err(format!("normalizer `{other}` is not supported")),
    }
    Ok(())
}

fn parse_pre_tokenizer(v: &Value, out: &mut Vec<PreTokenize>) -> std::result::Result<(), String> {
    match kind(v) {
        "Sequence" => {
            for p in v
                .get("pretokenizers")
                .and_then(Value::as_array)
                .ok_or("pre_tokenizer Sequence without `pretokenizers`")?
            {
                parse_pre_tokenizer(p, out)?;
            }
        }
        "Split" => {
            let pattern = string_pattern(v, "pre_tokenizer Split")?;
            if v.get("invert").and_then(Value::as_bool) == Some(true) {
                return Err("pre_tokenizer Split with invert is not supported".into());
            }
            let behavior = match v.get("behavior").and_then(Value::as_str) {
                Some("Removed") => Behavior::Removed,
                Some("Isolated") => Behavior::Isolated,
                Some("MergedWithPrevious") => Behavior::MergedWithPrevious,
                Some("MergedWithNext") => Behavior::MergedWithNext,
                Some("Contiguous") => Behavior::Contiguous,
                other => return Err(format!("pre_tokenizer Split behavior {other:?}")),
            };
            if pattern.is_empty() {
                return Err("pre_tokenizer Split with an empty pattern".into());
            }
            out.push(PreTokenize::Split { pattern, behavior });
        }
        "Metaspace" => {
            let replacement = v
                .get("replacement")
                .and_then(Value::as_str)
                .and_then(|s| s.chars().next())
                .unwrap_or('▁');
            let prepend = match v.get("prepend_scheme").and_then(Value::as_str) {
                Some("always") => Prepend::Always,
                Some("first") => Prepend::First,
                Some("never") => Prepend::Never,
                None => match v.get("add_prefix_space").and_then(Value::as_bool) {
                    Some(false) => Prepend::Never,
                    _ => Prepend::Always,
                },
                Some(other) => return Err(format!("Metaspace prepend_scheme {other:?}")),
            };
            let split = v.get("split").and_then(Value::as_bool).unwrap_or(true);
            out.push(PreTokenize::Metaspace {
                replacement,
                prepend,
                split,
            });
        }
        other => return Err(format!("pre_tokenizer `{other}` is not supported")),
    }
    Ok(())
}

/// Splits `s` around every (non-overlapping, leftmost) occurrence of `pattern`.
fn split_matches(s: &str, pattern: &str, behavior: Behavior) -> Vec<String> {
    // (text, is_match) runs.
    let mut runs: Vec<(&str, bool)> = Vec::new();
    let mut last = 0;
    for (at, m) in s.match_indices(pattern) {
        if at > last {
            runs.push((&s[last..at], false));
        }
        runs.push((m, true));
        last = at + m.len();
    }
    if last < s.len() {
        runs.push((&s[last..], false));
    }
    let mut out: Vec<String> = Vec::new();
    match behavior {
        Behavior::Removed => out.extend(runs.iter().filter(|r| !r.1).map(|r| r.0.to_string())),
        Behavior::Isolated => out.extend(runs.iter().map(|r| r.0.to_string())),
        Behavior::MergedWithPrevious => {
            let mut prev_plain = false;
            for (t, m) in runs {
                if m && prev_plain {
                    out.last_mut().expect("previous run").push_str(t);
                } else {
                    out.push(t.to_string());
                }
                prev_plain = !m;
            }
        }
        Behavior::MergedWithNext => {
            // A match joins the piece after it, unless that piece is a match too.
            let mut next_match = false;
            for (t, m) in runs.into_iter().rev() {
                if m && !next_match && !out.is_empty() {
                    out.last_mut().expect("checked").insert_str(0, t);
                } else {
                    out.push(t.to_string());
                }
                next_match = m;
            }
            out.reverse();
        }
        Behavior::Contiguous => {
            let mut prev_match = false;
            for (t, m) in runs {
                if m && prev_match {
                    out.last_mut().expect("previous run").push_str(t);
                } else {
                    out.push(t.to_string());
                }
                prev_match = m;
            }
        }
    }
    out
}

fn pre_tokenize(p: &PreTokenize, s: &str, first: bool) -> Vec<String> {
    match p {
        PreTokenize::Split { pattern, behavior } => split_matches(s, pattern, *behavior),
        PreTokenize::Metaspace {
            replacement,
            prepend,
            split,
        } => {
            let mut t = s.replace(' ', &replacement.to_string());
            let add = match prepend {
                Prepend::Always => true,
                Prepend::First => first,
                Prepend::Never => false,
            };
            if add && !t.starts_with(*replacement) {
                t.insert(0, *replacement);
            }
            if *split {
                split_matches(&t, &replacement.to_string(), Behavior::MergedWithNext)
            } else {
                vec![t]
            }
        }
    }
}

/// Buffers [`Tokenizer::encode_into`] reuses.
#[derive(Default)]
pub struct EncodeScratch {
    text: String,
    tmp: String,
    syms: Vec<u32>,
    merging: Merging,
}

/// The BPE merge loop's linked list and heap of candidate pairs.
#[derive(Default)]
struct Merging {
    next: Vec<u32>,
    prev: Vec<u32>,
    heap: std::collections::BinaryHeap<std::cmp::Reverse<(u32, u32)>>,
}

impl Merging {
    fn with_capacity(symbols: usize) -> Merging {
        Merging {
            next: Vec::with_capacity(symbols),
            prev: Vec::with_capacity(symbols),
            // Every symbol's pair, then at most two new pairs per merge.
            heap: std::collections::BinaryHeap::with_capacity(3 * symbols),
        }
    }
}

/// A merged-away symbol in the BPE loop.
const GONE: u32 = u32::MAX;

/// Hashes the merge table's `(left, right)` id pairs (FxHash's multiply-rotate): the merge
/// loop looks pairs up often, and SipHash's resistance to chosen keys is not needed for a
/// table loaded from a file.
#[derive(Clone, Copy, Default)]
struct PairHash;

#[derive(Default)]
struct PairHasher(u64);

impl std::hash::BuildHasher for PairHash {
    type Hasher = PairHasher;
    fn build_hasher(&self) -> PairHasher {
        PairHasher(0)
    }
}

impl std::hash::Hasher for PairHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u32(u32::from(*b));
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = (self.0.rotate_left(5) ^ u64::from(v)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// Buffers [`pi05_tokens_into`] reuses (the prompt text and the encoder's), and the last
/// prompt it encoded with its ids: a prompt equal to the last one (the same task, state bins
/// and tokenizer, as between most control ticks) is not encoded again.
#[derive(Default)]
pub struct PromptScratch {
    prompt: String,
    encode: EncodeScratch,
    /// The tokenizer (its id; 0: none) the last prompt (with its tail) was encoded with, and
    /// its ids.
    last_tokenizer: u64,
    last_prompt: String,
    last_ids: Vec<u32>,
}

impl PromptScratch {
    /// The ids of `scratch.prompt` by `tokenizer`: BOS, the prompt, then `tail` — the ids
    /// remembered from the last call when the prompt and tokenizer are the same.
    fn encode_prompt(
        &mut self,
        tokenizer: &Tokenizer,
        bos: u32,
        tail: &str,
        ids: &mut Vec<u32>,
    ) -> Result<()> {
        ids.clear();
        let last = &self.last_prompt;
        if self.last_tokenizer == tokenizer.id
            && last.len() == self.prompt.len() + tail.len()
            && last.starts_with(&self.prompt)
            && last.ends_with(tail)
        {
            ids.extend_from_slice(&self.last_ids);
            return Ok(());
        }
        self.last_tokenizer = 0;
        ids.push(bos);
        tokenizer.encode_into(&self.prompt, ids, &mut self.encode)?;
        if !tail.is_empty() {
            tokenizer.encode_into(tail, ids, &mut self.encode)?;
        }
        self.last_prompt.clear();
        self.last_prompt.push_str(&self.prompt);
        self.last_prompt.push_str(tail);
        self.last_ids.clear();
        self.last_ids.extend_from_slice(ids);
        self.last_tokenizer = tokenizer.id;
        Ok(())
    }
}

impl PromptScratch {
    /// Buffers large enough for any prompt of a task of at most `task_bytes` bytes and a
    /// state of `state_len` values, so that not even the first such prompts grow them (`ids`
    /// given to [`pi05_tokens_into`] needs [`PromptScratch::max_ids`] of capacity too).
    pub fn with_capacity(task_bytes: usize, state_len: usize) -> PromptScratch {
        let prompt = Self::max_prompt_bytes(task_bytes, state_len);
        // Normalizers may widen the text (a space becomes the 3-byte `▁`) and prepend to it.
        let text = 3 * prompt + 16;
        PromptScratch {
            prompt: String::with_capacity(prompt),
            last_tokenizer: 0,
            last_prompt: String::with_capacity(prompt + 1),
            last_ids: Vec::with_capacity(Self::max_ids(task_bytes, state_len)),
            encode: EncodeScratch {
                text: String::with_capacity(text),
                tmp: String::with_capacity(text),
                syms: Vec::with_capacity(text),
                merging: Merging::with_capacity(text),
            },
        }
    }

    /// At most one id per byte of the prompt (byte fallback), and BOS.
    pub fn max_ids(task_bytes: usize, state_len: usize) -> usize {
        Self::max_prompt_bytes(task_bytes, state_len) + 1
    }

    /// `Task: ` + task + `, State: ` + up to 4 bytes a value (`-1 `, `255 `) + `;\nAction: `.
    fn max_prompt_bytes(task_bytes: usize, state_len: usize) -> usize {
        6 + task_bytes + 9 + 4 * state_len + 10
    }
}

/// Token ids of the pi05 prompt for `task` and the normalized state: BOS, then the prompt
/// `Task: …, State: …;\nAction: ` (openpi's PaliGemma tokenizer with state). More than
/// `max_len` tokens is an error (openpi would truncate, cutting off `Action:`).
pub fn pi05_tokens(
    tokenizer: &Tokenizer,
    task: &str,
    normalized_state: &[f32],
    max_len: usize,
) -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    let mut scratch = PromptScratch::default();
    pi05_tokens_into(
        tokenizer,
        task,
        normalized_state,
        max_len,
        &mut ids,
        &mut scratch,
    )?;
    Ok(ids)
}

/// [`pi05_tokens`] into `ids` (replacing its contents), with `scratch`'s buffers reused: what
/// a control loop calls every tick without allocating (tokenizers without pre-tokenizers).
pub fn pi05_tokens_into(
    tokenizer: &Tokenizer,
    task: &str,
    normalized_state: &[f32],
    max_len: usize,
    ids: &mut Vec<u32>,
    scratch: &mut PromptScratch,
) -> Result<()> {
    let bos = required_bos(tokenizer)?;
    write_pi05_prompt(task, normalized_state, &mut scratch.prompt)?;
    scratch.encode_prompt(tokenizer, bos, "", ids)?;
    if ids.len() > max_len {
        return Err(Error::BadInput {
            what: "prompt".into(),
            reason: format!(
                "{} tokens with the state, the model takes at most {max_len}",
                ids.len()
            ),
        });
    }
    Ok(())
}

/// Token ids of the Pi0 prompt for `task`: BOS, the task (trimmed, underscores and newlines
/// made spaces), then `\n` encoded on its own — openpi's PaliGemma tokenizer without a state
/// (its "start of answer" token). Pi0 takes the state as an input of its own. More than
/// `max_len` tokens is an error (openpi would truncate).
pub fn pi0_tokens(tokenizer: &Tokenizer, task: &str, max_len: usize) -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    let mut scratch = PromptScratch::default();
    pi0_tokens_into(tokenizer, task, max_len, &mut ids, &mut scratch)?;
    Ok(ids)
}

/// The tokenizer's BOS id, which every prompt starts with.
fn required_bos(tokenizer: &Tokenizer) -> Result<u32> {
    tokenizer.bos().ok_or_else(|| Error::BadTokenizer {
        path: tokenizer.path.clone(),
        reason: "no <bos> token".into(),
    })
}

/// [`pi0_tokens`] into `ids` (replacing its contents), with `scratch`'s buffers reused.
pub fn pi0_tokens_into(
    tokenizer: &Tokenizer,
    task: &str,
    max_len: usize,
    ids: &mut Vec<u32>,
    scratch: &mut PromptScratch,
) -> Result<()> {
    let bos = required_bos(tokenizer)?;
    write_pi0_task(task, &mut scratch.prompt)?;
    scratch.encode_prompt(tokenizer, bos, "\n", ids)?;
    if ids.len() > max_len {
        return Err(Error::BadInput {
            what: "prompt".into(),
            reason: format!("{} tokens, the model takes at most {max_len}", ids.len()),
        });
    }
    Ok(())
}
