//! The prompt tokenizer against Hugging Face `tokenizers` (ids recorded by
//! `scripts/vla-tokenizer-references.py`): a small generated SentencePiece-BPE tokenizer
//! (committed), and a real Gemma tokenizer.json (262k pieces, 515k merges) that
//! `scripts/fetch-models.sh` installs.

use frt_vla::inputs::pi05_prompt;
use frt_vla::{
    Error, PromptScratch, Tokenizer, pi0_tokens, pi0_tokens_into, pi05_tokens, pi05_tokens_into,
};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn refs() -> Value {
    serde_json::from_str(&std::fs::read_to_string(data("tokenizer-references.json")).unwrap())
        .unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn gemma_path() -> PathBuf {
    let p = std::env::var_os("FRT_GEMMA_TOKENIZER")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../.cache/npm/tokenizer-gemma3/package/models/tokenizer.json")
        });
    assert!(
        p.exists(),
        "the Gemma tokenizer.json is not at {} — run scripts/fetch-models.sh (or set FRT_GEMMA_TOKENIZER)",
        p.display()
    );
    p
}

/// Every text and every pi05 prompt encodes to the recorded ids.
fn check(tok: &Tokenizer, refs: &Value, key: &str) {
    let texts = refs["texts"].as_array().unwrap();
    for (text, want) in texts.iter().zip(refs[key]["texts"].as_array().unwrap()) {
        let text = text.as_str().unwrap();
        let got = tok.encode(text).unwrap();
        assert_eq!(got, ids(want), "{key}: {text:?}");
        // Decoding gives the text back (`▁` in the text itself decodes as a space).
        assert_eq!(tok.decode(&got), text.replace('▁', " "), "{key}: decode");
    }
    let tasks = refs["tasks"].as_array().unwrap();
    for (i, (case, want)) in tasks
        .iter()
        .zip(refs[key]["pi05"].as_array().unwrap())
        .enumerate()
    {
        let state: Vec<f32> = case["state"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let task = case["task"].as_str().unwrap();
        assert_eq!(
            pi05_prompt(task, &state).unwrap(),
            refs["prompts"][i].as_str().unwrap()
        );
        let got = pi05_tokens(tok, task, &state, 200).unwrap();
        assert_eq!(got, ids(want), "{key}: pi05 prompt {i}");
        // Too long for the model: an error, not a truncated prompt.
        let short = got.len() - 1;
        match pi05_tokens(tok, task, &state, short) {
            Err(Error::BadInput { what, reason }) => {
                assert_eq!(what, "prompt");
                assert!(reason.contains(&format!("at most {short}")), "{reason}");
            }
            other => panic!("expected a prompt error, got {other:?}"),
        }
    }
}

#[test]
fn small_tokenizer_matches_hf_tokenizers() {
    let tok = Tokenizer::load(&data("tokenizer-small.json")).unwrap();
    assert_eq!(tok.bos(), Some(2));
    check(&tok, &refs(), "small");
}

/// The merge loop against the plain definition of BPE — repeatedly merge the adjacent pair
/// of lowest rank, the leftmost of equals — written out here from the small tokenizer's file,
/// on random texts made of its single-character pieces (not its added tokens), spaces, and
/// characters it only has bytes for.
#[test]
fn merges_follow_the_definition_of_bpe_on_random_texts() {
    let tok = Tokenizer::load(&data("tokenizer-small.json")).unwrap();
    let file: Value =
        serde_json::from_str(&std::fs::read_to_string(data("tokenizer-small.json")).unwrap())
            .unwrap();
    let vocab: std::collections::HashMap<String, u32> = file["model"]["vocab"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap() as u32))
        .collect();
    let merges: std::collections::HashMap<(u32, u32), (usize, u32)> = file["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(rank, m)| {
            let (a, b) = (m[0].as_str().unwrap(), m[1].as_str().unwrap());
            ((vocab[a], vocab[b]), (rank, vocab[&format!("{a}{b}")]))
        })
        .collect();
    let naive = |text: &str| -> Vec<u32> {
        let mut syms: Vec<u32> = Vec::new();
        for c in text.replace(' ', "▁").chars() {
            match vocab.get(&c.to_string()) {
                Some(id) => syms.push(*id),
                None => {
                    let mut buf = [0u8; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        syms.push(vocab[&format!("<0x{b:02X}>")]);
                    }
                }
            }
        }
        loop {
            let best = (0..syms.len().saturating_sub(1))
                .filter_map(|i| {
                    merges
                        .get(&(syms[i], syms[i + 1]))
                        .map(|(r, m)| (*r, i, *m))
                })
                .min();
            let Some((_, i, m)) = best else { break };
            syms[i] = m;
            syms.remove(i + 1);
        }
        syms
    };
    let mut alphabet: Vec<char> = vocab
        .keys()
        // Not `\n`: it is an added token, matched before BPE.
        .filter(|k| k.chars().count() == 1 && *k != "▁" && *k != "\n")
        .map(|k| k.chars().next().unwrap())
        .collect();
    alphabet.sort();
    alphabet.extend([' ', ' ', ' ', 'é', '→']);
    let mut x = 0x9e37_79b9_u32;
    let mut next = |n: usize| {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x as usize % n
    };
    for case in 0..2000 {
        let len = 1 + next(60);
        let text: String = (0..len).map(|_| alphabet[next(alphabet.len())]).collect();
        assert_eq!(
            tok.encode(&text).unwrap(),
            naive(&text),
            "case {case}: {text:?}"
        );
    }
}

#[test]
fn gemma_tokenizer_matches_hf_tokenizers() {
    let tok = Tokenizer::load(&gemma_path()).unwrap();
    assert_eq!(tok.vocab_size(), 262_145);
    assert_eq!(tok.bos(), Some(2));
    check(&tok, &refs(), "gemma3");
}

#[test]
fn pre_tokenizer_and_normalizer_variants_match_hf_tokenizers() {
    let refs = refs();
    let small: Value =
        serde_json::from_str(&std::fs::read_to_string(data("tokenizer-small.json")).unwrap())
            .unwrap();
    let variants = refs["variants"].as_object().unwrap();
    assert_eq!(variants.len(), 4);
    for (name, v) in variants {
        let mut j = small.clone();
        for (k, x) in v["json"].as_object().unwrap() {
            j[k] = x.clone();
        }
        let tok = Tokenizer::parse(&j.to_string(), Path::new(name)).unwrap();
        let texts = refs["texts"].as_array().unwrap();
        for (text, want) in texts.iter().zip(v["texts"].as_array().unwrap()) {
            let text = text.as_str().unwrap();
            assert_eq!(tok.encode(text).unwrap(), ids(want), "{name}: {text:?}");
        }
    }
}

fn broken(text: &str) -> String {
    match Tokenizer::parse(text, Path::new("t.json")) {
        Err(Error::BadTokenizer { path, reason }) => {
            assert_eq!(path, Path::new("t.json"));
            reason
        }
        Err(e) => panic!("expected BadTokenizer, got {e}"),
        Ok(_) => panic!("accepted a broken tokenizer: {text}"),
    }
}

#[test]
fn broken_tokenizers_are_named_errors() {
    let base = r#"{"normalizer": null, "pre_tokenizer": null, "added_tokens": [],
        "model": {"type": "BPE", "byte_fallback": false, "unk_token": "<unk>",
                  "vocab": {"<unk>": 0, "a": 1, "b": 2, "ab": 3}, "merges": ["a b"]}}"#;
    assert!(Tokenizer::parse(base, Path::new("t.json")).is_ok());
    assert!(broken("not json").contains("not a tokenizer.json"));
    assert!(broken(&base.replace("\"BPE\"", "\"WordPiece\"")).contains("WordPiece"));
    assert!(broken(&base.replace("\"a b\"", "\"a c\"")).contains("merge 0"));
    assert!(broken(&base.replace("\"a b\"", "\"ab\"")).contains("not `a b`"));
    assert!(
        broken(&base.replace("\"unk_token\": \"<unk>\"", "\"unk_token\": \"?\""))
            .contains("unk_token")
    );
    assert!(
        broken(&base.replace("\"byte_fallback\": false", "\"byte_fallback\": true"))
            .contains("<0x00>")
    );
    assert!(
        broken(&base.replace("\"normalizer\": null", r#""normalizer": {"type": "NFKC"}"#))
            .contains("NFKC")
    );
    assert!(
        broken(&base.replace(
            "\"pre_tokenizer\": null",
            r#""pre_tokenizer": {"type": "ByteLevel"}"#
        ))
        .contains("ByteLevel")
    );
    let missing = Tokenizer::load(Path::new("/nonexistent/tokenizer.json"));
    assert!(matches!(missing, Err(Error::Io { .. })));

    // Without byte fallback an unknown character is the unk token, fused with `fuse_unk`
    // (ids as `tokenizers` gives them).
    let tok = Tokenizer::parse(base, Path::new("t.json")).unwrap();
    assert_eq!(tok.encode("abxyb").unwrap(), vec![3, 0, 0, 2]);
    let fused = base.replace("\"byte_fallback\"", "\"fuse_unk\": true, \"byte_fallback\"");
    let fused = Tokenizer::parse(&fused, Path::new("t.json")).unwrap();
    assert_eq!(fused.encode("abxyb").unwrap(), vec![3, 0, 2]);
    assert_eq!(tok.bos(), None);
    assert!(matches!(
        pi05_tokens(&tok, "a", &[0.0], 48),
        Err(Error::BadTokenizer { .. })
    ));
}

/// Tokenizer files that once crashed the loader are clear errors (or load), never a panic or
/// a runaway allocation.
#[test]
fn corrupt_tokenizers_are_refused_without_a_crash() {
    let p = std::path::Path::new("<test>");
    // An added token repeating a vocabulary piece under an id beyond the vocabulary.
    let t = Tokenizer::parse(
        r#"{"model":{"vocab":{"a":0,"<bos>":1},"merges":[]},"added_tokens":[{"id":5,"content":"a"}]}"#,
        p,
    )
    .unwrap();
    assert_eq!(t.vocab_size(), 6);
    assert_eq!(t.encode("a").unwrap(), vec![5]);
    // 40 normalizers, each doubling the text: 2^40-fold.
    let doubling = vec![r#"{"type":"Replace","pattern":{"String":"a"},"content":"aa"}"#; 40];
    let text = format!(
        r#"{{"model":{{"vocab":{{"a":0,"<bos>":1}},"merges":[]}},"normalizer":{{"type":"Sequence","normalizers":[{}]}}}}"#,
        doubling.join(",")
    );
    let e = Tokenizer::parse(&text, p).err().unwrap().to_string();
    assert!(e.contains("grow a text"), "{e}");
    // An empty pattern (a replacement between every two characters).
    let e = Tokenizer::parse(
        r#"{"model":{"vocab":{"a":0},"merges":[]},"normalizer":{"type":"Replace","pattern":{"String":""},"content":"b"}}"#,
        p,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("empty pattern"), "{e}");
}

/// Pi0's prompt (openpi's tokenizer without a state): BOS, the cleaned task, then `\n`
/// encoded on its own, and no state.
#[test]
fn pi0_prompt_is_the_cleaned_task_then_a_newline_token() {
    let tok = Tokenizer::load(&gemma_path()).unwrap();
    let ids = frt_vla::pi0_tokens(&tok, "  pick_up the\ncup ", 48).unwrap();
    let mut want = vec![2];
    want.extend(tok.encode("pick up the cup").unwrap());
    want.extend(tok.encode("\n").unwrap());
    assert_eq!(ids, want);
    assert_eq!(tok.encode("\n").unwrap().len(), 1);
    // The capacity is checked, an empty task refused.
    let err = frt_vla::pi0_tokens(&tok, "pick up the cup", ids.len() - 1).unwrap_err();
    assert!(err.to_string().contains("at most"), "{err}");
    assert!(frt_vla::pi0_tokens(&tok, " \n ", 48).is_err());
}

/// A reused scratch remembers the last prompt's ids: the same prompt again gives them without
/// encoding, and another prompt, another tokenizer or the other prompt form (Pi0's) encodes
/// anew — every call gives what a fresh encode gives.
#[test]
fn a_reused_scratch_gives_what_a_fresh_encode_gives() {
    let small = Tokenizer::load(&data("tokenizer-small.json")).unwrap();
    let gemma = Tokenizer::load(&gemma_path()).unwrap();
    let (a, b) = ([0.1f32, -0.5, 0.9], [0.1f32, -0.49, 0.9]);
    // (tokenizer, task, state; None: Pi0's prompt)
    let calls: [(&Tokenizer, &str, Option<&[f32]>); 9] = [
        (&gemma, "pick up the cup", Some(&a)),
        (&gemma, "pick up the cup", Some(&a)),
        (&small, "pick up the cup", Some(&a)),
        (&gemma, "pick up the cup", Some(&a)),
        (&gemma, "pick up the cup", Some(&b)),
        (&gemma, "pick up the fork", Some(&b)),
        (&gemma, "pick up the fork", None),
        (&gemma, "pick up the fork", Some(&b)),
        (&small, "pick up the fork", None),
    ];
    let mut scratch = PromptScratch::with_capacity(64, 3);
    let mut ids = Vec::new();
    for (k, (tok, task, state)) in calls.iter().enumerate() {
        let want = match state {
            Some(s) => {
                pi05_tokens_into(tok, task, s, 200, &mut ids, &mut scratch).unwrap();
                pi05_tokens(tok, task, s, 200).unwrap()
            }
            None => {
                pi0_tokens_into(tok, task, 200, &mut ids, &mut scratch).unwrap();
                pi0_tokens(tok, task, 200).unwrap()
            }
        };
        assert_eq!(ids, want, "call {k}");
    }
    // Remembered ids are still held to the model's length.
    let n = ids.len();
    pi0_tokens_into(&small, "pick up the fork", n, &mut ids, &mut scratch).unwrap();
    assert!(pi0_tokens_into(&small, "pick up the fork", n - 1, &mut ids, &mut scratch).is_err());
}
