//! The weight store over real files: safetensors (one file and shards), CTranslate2, and
//! generated tensors; lookups, errors and uploads into each precision on the host backend.

use frt_exec::Ctx;
use frt_kernels::DType;
use frt_nn::{Error, Store, Stored, upload_stacked};
use half::{bf16, f16};
use std::path::PathBuf;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("frt-nn-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x as f32 / u32::MAX as f32 - 0.5) * 3.0
        })
        .collect()
}

/// Writes `tensors` (name, shape, f32 values) as one safetensors file in `dtype`.
fn write(path: &std::path::Path, tensors: &[(&str, Vec<usize>, Vec<f32>)], dtype: Stored) {
    let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = tensors
        .iter()
        .map(|(n, s, v)| {
            let b = match dtype {
                Stored::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                Stored::BF16 => v
                    .iter()
                    .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
                    .collect(),
                Stored::F16 => v
                    .iter()
                    .flat_map(|x| f16::from_f32(*x).to_le_bytes())
                    .collect(),
                Stored::E4M3 => unreachable!("written by Store::write_quantized"),
            };
            (n.to_string(), b, s.clone())
        })
        .collect();
    let dt = match dtype {
        Stored::F32 => safetensors::Dtype::F32,
        Stored::BF16 => safetensors::Dtype::BF16,
        Stored::F16 => safetensors::Dtype::F16,
        Stored::E4M3 => unreachable!("written by Store::write_quantized"),
    };
    let views: Vec<_> = bytes
        .iter()
        .map(|(n, b, s)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(dt, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, &None, path).unwrap();
}

#[test]
fn lookups_are_hierarchical_and_errors_name_the_full_path() {
    let d = tmp("paths");
    let q = values(6 * 4, 1);
    write(
        &d.join("model.safetensors"),
        &[
            ("enc.layers.3.q.weight", vec![6, 4], q.clone()),
            ("enc.layers.3.q.bias", vec![6], values(6, 2)),
        ],
        Stored::F32,
    );
    let st = Store::open(&d).unwrap();
    let layer = st.pp("enc").pp("layers").pp(3);
    assert_eq!(layer.name("q.weight"), "enc.layers.3.q.weight");
    let w = layer.get("q.weight", &[6, 4]).unwrap();
    assert_eq!(w.to_f32().unwrap(), q);
    assert_eq!(w.stored(), Stored::F32);
    match layer.get("k.weight", &[6, 4]) {
        Err(Error::MissingTensor { name, expected }) => {
            assert_eq!(name, "enc.layers.3.k.weight");
            assert_eq!(expected, vec![6, 4]);
        }
        other => panic!("{other:?}"),
    }
    match layer.get("q.weight", &[4, 6]) {
        Err(Error::TensorShape {
            name,
            got,
            expected,
        }) => {
            assert_eq!(name, "enc.layers.3.q.weight");
            assert_eq!((got, expected), (vec![6, 4], vec![4, 6]));
        }
        other => panic!("{other:?}"),
    }
    let e = layer.get("k.weight", &[6, 4]).unwrap_err().to_string();
    assert!(
        e.contains("enc.layers.3.k.weight") && e.contains("[6, 4]"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn shards_open_through_their_index() {
    let d = tmp("shards");
    let (a, b) = (values(10, 3), values(12, 4));
    write(
        &d.join("part-1.safetensors"),
        &[("a", vec![10], a.clone())],
        Stored::BF16,
    );
    write(
        &d.join("part-2.safetensors"),
        &[("b", vec![3, 4], b.clone())],
        Stored::F16,
    );
    std::fs::write(
        d.join("model.safetensors.index.json"),
        r#"{"metadata": {}, "weight_map": {"a": "part-1.safetensors", "b": "part-2.safetensors"}}"#,
    )
    .unwrap();
    let st = Store::open(&d).unwrap();
    assert_eq!(st.names(), vec!["a", "b"]);
    let got = st.view("a").unwrap().to_f32().unwrap();
    assert!(
        got.iter()
            .zip(&a)
            .all(|(g, w)| *g == bf16::from_f32(*w).to_f32())
    );
    let got = st.view("b").unwrap().to_f32().unwrap();
    assert!(
        got.iter()
            .zip(&b)
            .all(|(g, w)| *g == f16::from_f32(*w).to_f32())
    );
    // A name in two shards is refused.
    write(
        &d.join("part-2.safetensors"),
        &[("a", vec![10], a)],
        Stored::F32,
    );
    let e = Store::open(&d).unwrap_err().to_string();
    assert!(e.contains("`a` is in more than one file"), "{e}");
    // Broken files name themselves.
    std::fs::write(d.join("part-2.safetensors"), b"not safetensors").unwrap();
    assert!(
        matches!(Store::open(&d), Err(Error::BadCheckpoint { file, .. }) if file.ends_with("part-2.safetensors"))
    );
    std::fs::remove_file(d.join("part-1.safetensors")).unwrap();
    assert!(matches!(Store::open(&d), Err(Error::Io { .. })));
    assert!(matches!(
        Store::open(&d.join("absent")),
        Err(Error::ModelFolder { .. })
    ));
    let _ = std::fs::remove_dir_all(&d);
}

/// Uploads convert straight into the target precision, rounding as f32 → dtype does, across
/// staging slots (f32 targets: more values than one slot holds) and the threads that fill
/// one; the same precision is copied unchanged.
#[test]
fn uploads_convert_into_each_precision() {
    let ctx = Ctx::host().unwrap();
    let s = ctx.stream(0).unwrap();
    let n = frt_nn::SLOT_BYTES / 4 + 1234;
    let v = values(n, 5);
    for stored in [Stored::F32, Stored::BF16, Stored::F16] {
        let d = tmp("convert");
        write(
            &d.join("model.safetensors"),
            &[("w", vec![n], v.clone())],
            stored,
        );
        let st = Store::open(&d).unwrap();
        let src = st.view("w").unwrap().to_f32().unwrap();
        assert_eq!(st.stored_bytes(), (n * stored.size()) as u64);
        for dt in [DType::F32, DType::BF16, DType::F16] {
            // Progress: an upload reads every stored byte once (other tests may upload at
            // the same time: at least).
            let before = frt_nn::bytes_read();
            let t = st.root().upload("w", &[n], &ctx, s, dt).unwrap();
            assert!(frt_nn::bytes_read() - before >= (n * stored.size()) as u64);
            assert_eq!(t.dtype(), dt);
            let got = t.read_f32(s).unwrap();
            let want: Vec<f32> = src
                .iter()
                .map(|x| match dt {
                    DType::BF16 => bf16::from_f32(*x).to_f32(),
                    DType::F16 => f16::from_f32(*x).to_f32(),
                    _ => *x,
                })
                .collect();
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{stored:?} → {dt:?}"
            );
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}

/// A checkpoint cut short after it was opened: the upload fails with an I/O error naming the
/// file (uploads read the file, FP8 ones, the host's `to_f32` and `check_finite` too; they
/// never touch a page past its new end).
#[test]
fn a_file_cut_short_under_the_store_is_an_io_error() {
    let ctx = Ctx::host().unwrap();
    let s = ctx.stream(0).unwrap();
    let d = tmp("cut");
    let path = d.join("model.safetensors");
    let (rows, cols) = (100, 1000);
    write(
        &path,
        &[("w", vec![rows, cols], values(rows * cols, 3))],
        Stored::F32,
    );
    let st = Store::open(&d).unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len - 4096)
        .unwrap();
    let io_error = |e: &Error| matches!(e, Error::Io { path: p, .. } if p == &path);
    for dt in [DType::F32, DType::BF16] {
        let e = st
            .root()
            .upload("w", &[rows, cols], &ctx, s, dt)
            .unwrap_err();
        assert!(io_error(&e), "{dt:?}: {e}");
    }
    let e = st.view("w").unwrap().upload_e4m3(&ctx, s).err().unwrap();
    assert!(io_error(&e), "FP8: {e}");
    let e = st.view("w").unwrap().to_f32().unwrap_err();
    assert!(io_error(&e), "to_f32: {e}");
    let e = st.view("w").unwrap().check_finite().unwrap_err();
    assert!(io_error(&e), "check_finite: {e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn non_finite_values_are_refused_by_name() {
    let ctx = Ctx::host().unwrap();
    let s = ctx.stream(0).unwrap();
    for stored in [Stored::F32, Stored::BF16, Stored::F16] {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let d = tmp("nan");
            let mut v = values(40, 6);
            v[17] = bad;
            write(
                &d.join("model.safetensors"),
                &[("x.y", vec![40], v)],
                stored,
            );
            let st = Store::open(&d).unwrap();
            let named = |e: Error| matches!(e, Error::NonFinite { name } if name == "x.y");
            assert!(named(st.check_finite().unwrap_err()), "{stored:?} {bad}");
            for dt in [DType::F32, DType::BF16] {
                let e = st.root().upload("x.y", &[40], &ctx, s, dt).unwrap_err();
                assert!(named(e), "{stored:?} → {dt:?} {bad}");
            }
            let _ = std::fs::remove_dir_all(&d);
            // In a tensor filled by several threads, in the last thread's part.
            let d = tmp("nan-large");
            let n = 300_000;
            let mut v = values(n, 7);
            v[n - 5] = bad;
            write(&d.join("model.safetensors"), &[("big", vec![n], v)], stored);
            let st = Store::open(&d).unwrap();
            for dt in [DType::F32, DType::BF16] {
                let e = st.root().upload("big", &[n], &ctx, s, dt).unwrap_err();
                assert!(
                    matches!(e, Error::NonFinite { ref name } if name == "big"),
                    "{stored:?} → {dt:?} {bad}: {e}"
                );
            }
            let _ = std::fs::remove_dir_all(&d);
        }
    }
}

#[test]
fn stacked_uploads_place_each_part_in_its_rows() {
    let ctx = Ctx::host().unwrap();
    let s = ctx.stream(0).unwrap();
    let (q, k, v) = (values(8, 7), values(4, 8), values(4, 9));
    let st = Store::from_f32(
        "<test>",
        [
            ("q".to_string(), vec![4, 2], q.clone()),
            ("k".to_string(), vec![2, 2], k.clone()),
            ("v".to_string(), vec![2, 2], v.clone()),
            ("odd".to_string(), vec![2, 3], values(6, 10)),
        ],
    );
    let views: Vec<_> = ["q", "k", "v"]
        .iter()
        .map(|n| st.view(n).unwrap())
        .collect();
    let t = upload_stacked(&views, &ctx, s, DType::F32).unwrap();
    assert_eq!(t.shape(), &[8, 2]);
    assert_eq!(t.read_f32(s).unwrap(), [q, k, v].concat());
    let mixed = [st.view("q").unwrap(), st.view("odd").unwrap()];
    assert!(matches!(
        upload_stacked(&mixed, &ctx, s, DType::F32),
        Err(Error::TensorShape { name, .. }) if name == "odd"
    ));
}

/// A CTranslate2 `model.bin` written by hand: tensors of each float type, an integer
/// scalar, an alias; a truncated copy names the offset.
#[test]
fn ctranslate2_files_open_with_scalars_and_aliases() {
    fn string(b: &mut Vec<u8>, s: &str) {
        b.extend_from_slice(&((s.len() + 1) as u16).to_le_bytes());
        b.extend_from_slice(s.as_bytes());
        b.push(0);
    }
    let w = values(6, 11);
    let mut b = Vec::new();
    b.extend_from_slice(&6u32.to_le_bytes());
    string(&mut b, "WhisperSpec");
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&3u32.to_le_bytes());
    // f32 [2, 3]
    string(&mut b, "enc/w");
    b.push(2);
    b.extend_from_slice(&2u32.to_le_bytes());
    b.extend_from_slice(&3u32.to_le_bytes());
    b.push(0);
    b.extend_from_slice(&24u32.to_le_bytes());
    b.extend(w.iter().flat_map(|x| x.to_le_bytes()));
    // bf16 [2]
    string(&mut b, "enc/b");
    b.push(1);
    b.extend_from_slice(&2u32.to_le_bytes());
    b.push(5);
    b.extend_from_slice(&4u32.to_le_bytes());
    b.extend(
        [1.5f32, -2.0]
            .iter()
            .flat_map(|x| bf16::from_f32(*x).to_le_bytes()),
    );
    // an i32 scalar
    string(&mut b, "enc/num_heads");
    b.push(0);
    b.push(3);
    b.extend_from_slice(&4u32.to_le_bytes());
    b.extend_from_slice(&6i32.to_le_bytes());
    // one alias
    b.extend_from_slice(&1u32.to_le_bytes());
    string(&mut b, "dec/w");
    string(&mut b, "enc/w");
    let d = tmp("ct2");
    std::fs::write(d.join("model.bin"), &b).unwrap();
    let st = Store::open(&d).unwrap();
    assert_eq!(st.scalar("spec:WhisperSpec"), Some(1));
    assert_eq!(st.scalar("enc/num_heads"), Some(6));
    assert_eq!(
        st.root().get("enc/w", &[2, 3]).unwrap().to_f32().unwrap(),
        w
    );
    assert_eq!(st.view("dec/w").unwrap().to_f32().unwrap(), w);
    assert_eq!(st.view("enc/b").unwrap().to_f32().unwrap(), vec![1.5, -2.0]);
    assert_eq!(st.view("enc/b").unwrap().stored(), Stored::BF16);
    std::fs::write(d.join("model.bin"), &b[..b.len() - 9]).unwrap();
    let e = Store::open(&d).unwrap_err().to_string();
    assert!(e.contains("truncated") && e.contains("model.bin"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

/// FP8 uploads quantize each row by its own largest magnitude, from a file in any stored
/// precision (a weight larger than one pass of 8 Mi codes, whose rows are split over the
/// threads that fill a staging slot, each quantizing a few rows at a time), stack like
/// `upload_stacked`, and refuse non-finite values (in the second pass too) and weights that are
/// not 2-D by name.
#[test]
fn fp8_uploads_quantize_each_row() {
    use frt_kernels::fp8::quantize_rows_e4m3;
    let dir = tmp("fp8");
    let ctx = Ctx::host().unwrap();
    let s = ctx.stream(0).unwrap();
    // 2200 rows of 4000: two passes of 2097 and 103 rows (8 Mi codes a pass).
    let (r1, r2, cols) = (2200usize, 7usize, 4000usize);
    let mut a = values(r1 * cols, 3);
    // Rows of very different sizes (and one of zeros).
    for (i, v) in a.iter_mut().enumerate() {
        *v *= (1 + i / cols % 5) as f32 * 0.1;
        if i / cols == 17 {
            *v = 0.0;
        }
    }
    let b = values(r2 * cols, 4);
    for stored in [Stored::F32, Stored::BF16] {
        let sub = dir.join(format!("{stored:?}"));
        std::fs::create_dir_all(&sub).unwrap();
        let path = sub.join("model.safetensors");
        write(
            &path,
            &[
                ("a", vec![r1, cols], a.clone()),
                ("b", vec![r2, cols], b.clone()),
            ],
            stored,
        );
        let store = Store::open(&sub).unwrap();
        let (va, vb) = (store.view("a").unwrap(), store.view("b").unwrap());
        let q = frt_nn::upload_stacked_e4m3(&[va.clone(), vb.clone()], &ctx, s).unwrap();
        assert_eq!(q.codes.shape(), &[r1 + r2, cols]);
        assert_eq!(q.codes.dtype(), DType::E4M3);
        let all: Vec<f32> = [va.to_f32().unwrap(), vb.to_f32().unwrap()].concat();
        let (codes, scales) = quantize_rows_e4m3(&all, r1 + r2, cols);
        assert!(q.codes.read_bytes(s).unwrap() == codes, "{stored:?}: codes");
        assert_eq!(q.scales.read_f32(s).unwrap(), scales, "{stored:?}: scales");
        assert_eq!(scales[17], 1.0, "a row of zeros keeps scale 1");
        let one = va.upload_e4m3(&ctx, s).unwrap();
        assert!(one.codes.read_bytes(s).unwrap() == codes[..r1 * cols]);
    }
    // A NaN in the second pass of rows, and a 1-D weight.
    let mut bad = a.clone();
    bad[2150 * cols + 5] = f32::NAN;
    let sub = dir.join("bad");
    std::fs::create_dir_all(&sub).unwrap();
    let path = sub.join("model.safetensors");
    write(
        &path,
        &[
            ("bad", vec![r1, cols], bad),
            ("bias", vec![cols], b[..cols].to_vec()),
        ],
        Stored::F32,
    );
    let store = Store::open(&sub).unwrap();
    let e = store
        .view("bad")
        .unwrap()
        .upload_e4m3(&ctx, s)
        .err()
        .unwrap();
    assert!(
        matches!(&e, Error::NonFinite { name } if name == "bad"),
        "{e}"
    );
    let e = store
        .view("bias")
        .unwrap()
        .upload_e4m3(&ctx, s)
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("bias") && e.to_string().contains("2-D"),
        "{e}"
    );
}

/// `Store::write_quantized` writes the chosen weights as E4M3 codes with their rows' scales
/// (the codes and scales an FP8 upload of the stored values computes), every other tensor
/// as stored, and copies the files beside the checkpoint; the store reads the codes back as
/// they are for FP8 uploads and decoded (`code · scale`) everywhere else.
#[test]
fn pre_quantized_checkpoints_round_trip() {
    use frt_kernels::fp8::{e4m3_to_f32, quantize_rows_e4m3};
    let dir = tmp("prequant");
    let ctx = Ctx::host().unwrap();
    let s = ctx.stream(0).unwrap();
    // Two passes of rows (8 Mi codes a pass) for `big`.
    let (rows, cols) = (2200usize, 4000usize);
    // Rows of different sizes, so that each row's scale is its own.
    let mut big = values(rows * cols, 11);
    for (i, v) in big.iter_mut().enumerate() {
        *v *= (1 + i / cols % 7) as f32 * 0.3;
    }
    let small = values(6 * 8, 12);
    let bias = values(8, 13);
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("assets/x")).unwrap();
    std::fs::write(src.join("config.json"), "{}").unwrap();
    std::fs::write(src.join("assets/x/norm_stats.json"), "{\"a\": 1}").unwrap();
    write(
        &src.join("model.safetensors"),
        &[
            ("l.big.weight", vec![rows, cols], big.clone()),
            ("l.small.weight", vec![6, 8], small.clone()),
            ("l.small.bias", vec![8], bias.clone()),
        ],
        Stored::BF16,
    );
    let mut store = Store::open(&src).unwrap();
    // An alias is written once, under its target's name, and is not quantized by its own.
    assert!(store.alias("l.tied.weight", "l.small.weight"));
    let e = store
        .write_quantized(&["l.tied.weight"], &dir.join("x0"))
        .err()
        .unwrap();
    assert!(e.to_string().contains("alias"), "{e}");
    let out = dir.join("out");
    let w = store
        .write_quantized(&["l.big.weight", "l.small.weight"], &out)
        .unwrap();
    assert_eq!((w.tensors, w.quantized, w.files_copied), (3, 2, 2));
    assert_eq!(
        w.bytes,
        std::fs::metadata(out.join("model.safetensors"))
            .unwrap()
            .len()
    );
    assert_eq!(
        std::fs::read_to_string(out.join("assets/x/norm_stats.json")).unwrap(),
        "{\"a\": 1}"
    );
    assert!(!out.join("model.safetensors.partial").exists());

    let q = Store::open(&out).unwrap();
    assert_eq!(
        q.names(),
        [
            "l.big.weight",
            "l.big.weight_scale",
            "l.small.bias",
            "l.small.weight",
            "l.small.weight_scale"
        ]
    );
    let (vb, vq) = (
        store.view("l.big.weight").unwrap(),
        q.view("l.big.weight").unwrap(),
    );
    assert_eq!(vq.stored(), Stored::E4M3);
    assert_eq!(vq.shape(), &[rows, cols]);
    // The bias as it was, bit for bit.
    assert_eq!(q.view("l.small.bias").unwrap().stored(), Stored::BF16);
    assert_eq!(
        q.view("l.small.bias").unwrap().to_f32().unwrap(),
        store.view("l.small.bias").unwrap().to_f32().unwrap()
    );
    // FP8 uploads: the same codes and scales from either checkpoint.
    let (codes, scales) = quantize_rows_e4m3(&vb.to_f32().unwrap(), rows, cols);
    for v in [&vb, &vq] {
        let up = v.upload_e4m3(&ctx, s).unwrap();
        assert!(up.codes.read_bytes(s).unwrap() == codes, "codes");
        assert!(up.scales.read_f32(s).unwrap() == scales, "scales");
    }
    assert!(vq.scales().unwrap() == &scales[..]);
    // Any other read decodes: code · its row's scale, then rounded as f32 values are.
    let decoded: Vec<f32> = codes
        .iter()
        .enumerate()
        .map(|(i, c)| e4m3_to_f32(*c) * scales[i / cols])
        .collect();
    assert!(vq.to_f32().unwrap() == decoded, "to_f32");
    for dt in [DType::F32, DType::BF16] {
        let t = vq.upload(&ctx, s, dt).unwrap();
        let want: Vec<f32> = match dt {
            DType::F32 => decoded.clone(),
            _ => decoded
                .iter()
                .map(|v| bf16::from_f32(*v).to_f32())
                .collect(),
        };
        assert!(t.read_f32(s).unwrap() == want, "{dt:?} upload");
    }
    // Written again: the codes and scales as they are.
    let again = dir.join("again");
    let w2 = q.write_quantized(&[], &again).unwrap();
    assert_eq!(w2.quantized, 2);
    assert_eq!(
        std::fs::read(again.join("model.safetensors")).unwrap(),
        std::fs::read(out.join("model.safetensors")).unwrap()
    );
    // Not into a folder that holds something.
    let e = store.write_quantized(&[], &out).err().unwrap();
    assert!(e.to_string().contains("not empty"), "{e}");
    // A NaN in a weight being quantized: an error naming it, nothing left in the folder
    // but what was copied before the checkpoint (no partial file).
    let mut nan = big.clone();
    nan[rows * cols - 3] = f32::NAN;
    let bad_src = dir.join("bad-src");
    std::fs::create_dir_all(&bad_src).unwrap();
    write(
        &bad_src.join("model.safetensors"),
        &[("l.big.weight", vec![rows, cols], nan)],
        Stored::BF16,
    );
    let bad_out = dir.join("bad-out");
    let e = Store::open(&bad_src)
        .unwrap()
        .write_quantized(&["l.big.weight"], &bad_out)
        .err()
        .unwrap();
    assert!(
        matches!(&e, Error::NonFinite { name } if name == "l.big.weight"),
        "{e}"
    );
    assert_eq!(std::fs::read_dir(&bad_out).unwrap().count(), 0);
    // Only 2-D weights, only tensors that exist.
    let e = store
        .write_quantized(&["l.small.bias"], &dir.join("x1"))
        .err()
        .unwrap();
    assert!(e.to_string().contains("`l.small.bias` is [8]"), "{e}");
    let e = store
        .write_quantized(&["l.none.weight"], &dir.join("x2"))
        .err()
        .unwrap();
    assert!(e.to_string().contains("`l.none.weight`"), "{e}");
}

/// A checkpoint of raw tensors and the error it must give.
type Case = (
    &'static str,
    Vec<(&'static str, safetensors::Dtype, Vec<usize>, Vec<u8>)>,
    &'static str,
);

/// A pre-quantized weight without its scales, with scales of the wrong shape or type, or
/// with a NaN code or a non-finite scale is refused, naming the tensor.
#[test]
fn broken_pre_quantized_weights_are_refused_by_name() {
    let dir = tmp("prequant-bad");
    let write_raw = |name: &str, tensors: &[(&str, safetensors::Dtype, Vec<usize>, Vec<u8>)]| {
        let sub = dir.join(name);
        std::fs::create_dir_all(&sub).unwrap();
        let views: Vec<_> = tensors
            .iter()
            .map(|(n, dt, s, b)| {
                (
                    n.to_string(),
                    safetensors::tensor::TensorView::new(*dt, s.clone(), b).unwrap(),
                )
            })
            .collect();
        safetensors::serialize_to_file(views, &None, &sub.join("model.safetensors")).unwrap();
        sub
    };
    use safetensors::Dtype::{F8_E4M3, F16, F32};
    let codes = vec![0x38u8; 12]; // 1.0
    let f32s = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let cases: [Case; 4] = [
        (
            "missing",
            vec![("w", F8_E4M3, vec![3, 4], codes.clone())],
            "no tensor `w_scale`",
        ),
        (
            "shape",
            vec![
                ("w", F8_E4M3, vec![3, 4], codes.clone()),
                ("w_scale", F32, vec![4], f32s(&[1.0; 4])),
            ],
            "not f32 [3]",
        ),
        (
            "dtype",
            vec![
                ("w", F8_E4M3, vec![3, 4], codes.clone()),
                ("w_scale", F16, vec![3], vec![0; 6]),
            ],
            "not f32 [3]",
        ),
        (
            "rank",
            vec![
                ("w", F8_E4M3, vec![12], codes.clone()),
                ("w_scale", F32, vec![12], f32s(&[1.0; 12])),
            ],
            "shape [12], not [rows, cols]",
        ),
    ];
    for (name, tensors, want) in cases {
        let e = Store::open(&write_raw(name, &tensors)).err().unwrap();
        let text = e.to_string();
        assert!(
            text.contains("the E4M3 weight `w`") && text.contains(want),
            "{name}: {text}"
        );
    }
    // Scales of [rows, 1] are taken.
    let ok = write_raw(
        "column",
        &[
            ("w", F8_E4M3, vec![3, 4], codes.clone()),
            ("w_scale", F32, vec![3, 1], f32s(&[1.0, 2.0, 0.5])),
        ],
    );
    let st = Store::open(&ok).unwrap();
    assert_eq!(
        st.view("w").unwrap().to_f32().unwrap(),
        [[1.0f32; 4], [2.0; 4], [0.5; 4]].concat()
    );
    // A non-finite scale (or one whose largest code overflows), a NaN code.
    for (name, scale) in [("nan-scale", f32::NAN), ("huge-scale", 1e38)] {
        let st = Store::open(&write_raw(
            name,
            &[
                ("w", F8_E4M3, vec![3, 4], codes.clone()),
                ("w_scale", F32, vec![3], f32s(&[1.0, scale, 1.0])),
            ],
        ))
        .unwrap();
        let e = st.view("w").err().unwrap();
        assert!(
            matches!(&e, Error::NonFinite { name } if name == "w_scale"),
            "{e}"
        );
    }
    let mut nan = codes.clone();
    nan[7] = 0xff;
    let st = Store::open(&write_raw(
        "nan-code",
        &[
            ("w", F8_E4M3, vec![3, 4], nan),
            ("w_scale", F32, vec![3], f32s(&[1.0; 3])),
        ],
    ))
    .unwrap();
    let v = st.view("w").unwrap();
    let ctx = Ctx::host().unwrap();
    let s = ctx.stream(0).unwrap();
    for e in [
        v.check_finite().err().unwrap(),
        v.upload_e4m3(&ctx, s).err().unwrap(),
        v.upload(&ctx, s, DType::BF16).err().unwrap(),
    ] {
        assert!(
            matches!(&e, Error::NonFinite { name } if name == "w"),
            "{e}"
        );
    }
}
