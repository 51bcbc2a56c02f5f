//! Corrupt inputs that once crashed the loaders: each is now a clear error, never a panic or
//! an allocation abort.

use frt_asr::Error;
use frt_asr::tokenizer::Tokenizer;
use frt_asr::weights::WhisperWeights;

/// A CTranslate2 `model.bin` with the given variables (name, dims, dtype, raw bytes).
fn ct2(vars: &[(&str, &[u32], u8, Vec<u8>)]) -> Vec<u8> {
    let mut b = Vec::new();
    let string = |b: &mut Vec<u8>, s: &str| {
        b.extend_from_slice(&(s.len() as u16 + 1).to_le_bytes());
        b.extend_from_slice(s.as_bytes());
        b.push(0);
    };
    b.extend_from_slice(&6u32.to_le_bytes());
    string(&mut b, "WhisperSpec");
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&(vars.len() as u32).to_le_bytes());
    for (name, dims, dtype, raw) in vars {
        string(&mut b, name);
        b.push(dims.len() as u8);
        for d in *dims {
            b.extend_from_slice(&d.to_le_bytes());
        }
        b.push(*dtype);
        b.extend_from_slice(&(raw.len() as u32).to_le_bytes());
        b.extend_from_slice(raw);
    }
    b.extend_from_slice(&0u32.to_le_bytes());
    b
}

fn f32s(n: usize) -> Vec<u8> {
    vec![0u8; n * 4]
}

fn load(name: &str, bytes: &[u8]) -> Result<WhisperWeights, Error> {
    let p = std::env::temp_dir().join(format!("frt-ct2-{name}-{}.bin", std::process::id()));
    std::fs::write(&p, bytes).unwrap();
    let r = WhisperWeights::load_ctranslate2(&p);
    let _ = std::fs::remove_file(&p);
    r
}

#[test]
fn a_rank_0_position_encoding_is_refused() {
    let bin = ct2(&[
        ("decoder/embeddings/weight", &[4, 8], 0, f32s(32)),
        ("encoder/conv1/weight", &[8, 80, 3], 0, f32s(8 * 80 * 3)),
        ("encoder/position_encodings/encodings", &[], 0, f32s(1)),
    ]);
    let e = load("rank0", &bin).err().unwrap().to_string();
    assert!(e.contains("encoder/position_encodings/encodings"), "{e}");
    assert!(e.contains("2 dimensions"), "{e}");
}

#[test]
fn a_dimension_product_that_overflows_is_refused() {
    let max = u32::MAX;
    let bin = ct2(&[("decoder/embeddings/weight", &[max, max, max], 0, f32s(2))]);
    let e = load("overflow", &bin).err().unwrap().to_string();
    assert!(e.contains("overflows"), "{e}");
}

#[test]
fn implausible_sizes_are_refused_before_anything_is_allocated() {
    // 100 000 decoder positions (Whisper has 448).
    let bin = ct2(&[
        ("decoder/embeddings/weight", &[4, 8], 0, f32s(32)),
        ("encoder/conv1/weight", &[8, 80, 3], 0, f32s(8 * 80 * 3)),
        (
            "encoder/position_encodings/encodings",
            &[1500, 8],
            0,
            f32s(1500 * 8),
        ),
        (
            "decoder/position_encodings/encodings",
            &[100_000, 8],
            0,
            f32s(100_000 * 8),
        ),
        ("encoder/layer_0/ffn/linear_0/weight", &[1, 1], 0, f32s(1)),
        ("decoder/layer_0/ffn/linear_0/weight", &[1, 1], 0, f32s(1)),
        ("encoder/num_heads", &[], 3, 2i32.to_le_bytes().to_vec()),
        ("decoder/num_heads", &[], 3, 2i32.to_le_bytes().to_vec()),
    ]);
    let e = load("sizes", &bin).err().unwrap().to_string();
    assert!(e.contains("n_text_ctx = 100000"), "{e}");
}

#[test]
fn a_huge_token_id_is_refused() {
    let e =
        Tokenizer::from_json(r#"{"model":{"type":"BPE","vocab":{"a":4000000000},"merges":[]}}"#)
            .err()
            .unwrap()
            .to_string();
    assert!(
        e.contains("4000000000") && e.contains("implausibly large"),
        "{e}"
    );
    let e = Tokenizer::from_json(
        r#"{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"added_tokens":[{"id":3000000000,"content":"b"}]}"#,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("implausibly large"), "{e}");
}
