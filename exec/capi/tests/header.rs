//! One source of truth for the ABI: the header `exec/include/flashrt/exec.h` must declare
//! exactly the functions this crate defines, with the same types, and the same status codes.

use std::collections::BTreeMap;

const HEADER: &str = include_str!("../../include/flashrt/exec.h");
const SOURCE: &str = include_str!("../src/lib.rs");

/// name -> (return type, parameter types), all normalized to C spelling without spaces.
type Sigs = BTreeMap<String, (String, Vec<String>)>;

fn squash(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace(" *", "*")
        .replace("* ", "*")
}

fn strip_c_comments(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        rest = &rest[i + 2..];
        let j = rest.find("*/").expect("closed comment");
        rest = &rest[j + 2..];
    }
    out.push_str(rest);
    out.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Splits at top-level commas (not inside parentheses).
fn split_params(s: &str) -> Vec<String> {
    let (mut depth, mut cur, mut out) = (0, String::new(), Vec::new());
    for ch in s.chars() {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(ch);
    }
    if !cur.trim().is_empty() {
        out.push(cur);
    }
    out.into_iter().map(|p| p.trim().to_string()).collect()
}

/// `const char *name` -> `const char*`; `void (*fn)(void *user)` -> `void(*)(void*)`.
fn c_param_type(p: &str) -> String {
    let p = squash(p);
    if let Some(star) = p.find("(*") {
        let close = p[star..].find(')').unwrap() + star;
        let args: Vec<String> = split_params(&p[close + 2..p.len() - 1])
            .iter()
            .map(|a| c_param_type(a))
            .collect();
        return format!("{}(*)({})", p[..star].trim(), args.join(","));
    }
    if p == "void" {
        return p;
    }
    let cut = p
        .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    squash(&p[..cut])
}

fn header_sigs() -> Sigs {
    let text = strip_c_comments(HEADER);
    let mut sigs = Sigs::new();
    for stmt in text.split(';') {
        let stmt = stmt.trim();
        if stmt.starts_with("typedef") || stmt.contains('{') || stmt.contains('}') {
            continue;
        }
        let Some(open) = stmt.find('(') else { continue };
        let head = &stmt[..open];
        let name_at = head
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
            .map_or(0, |i| i + 1);
        let name = head[name_at..].to_string();
        if !name.starts_with("frt_") {
            continue;
        }
        let ret = squash(&head[..name_at]);
        let params: Vec<String> = split_params(&stmt[open + 1..stmt.len() - 1])
            .iter()
            .map(|p| c_param_type(p))
            .filter(|p| p != "void")
            .collect();
        assert!(
            sigs.insert(name.clone(), (ret, params)).is_none(),
            "{name} declared twice"
        );
    }
    sigs
}

fn rust_to_c(t: &str) -> String {
    let t = squash(t);
    match t.as_str() {
        "FrtCtx" => "frt_ctx",
        "FrtBuffer" => "frt_buffer",
        "FrtGraph" => "frt_graph",
        "FrtPlan" => "frt_plan",
        "FrtEvent" => "frt_event",
        "FrtShapeKey" => "frt_shape_key",
        "c_int" => "int",
        "usize" => "size_t",
        "*mut c_void" => "void*",
        "*const c_void" => "const void*",
        "*const c_char" => "const char*",
        "*mut FrtBuffer" => "frt_buffer*",
        "RecordFn" => "void(*)(void*,void*)",
        "HostFn" => "void(*)(void*)",
        "" => "void",
        other => panic!("add a C spelling for the Rust type `{other}`"),
    }
    .to_string()
}

fn rust_sigs() -> Sigs {
    let mut sigs = Sigs::new();
    for (i, _) in SOURCE.match_indices("extern \"C\" fn frt_") {
        let line_start = SOURCE[..i].rfind('\n').unwrap() + 1;
        assert!(
            SOURCE[..line_start]
                .trim_end()
                .ends_with("#[unsafe(no_mangle)]"),
            "exported with no_mangle"
        );
        let rest = &SOURCE[i + "extern \"C\" fn ".len()..];
        let open = rest.find('(').unwrap();
        let name = rest[..open].to_string();
        let mut depth = 0;
        let close = rest.char_indices().skip(open).find(|&(_, c)| {
            depth += match c {
                '(' => 1,
                ')' => -1,
                _ => 0,
            };
            depth == 0
        });
        let close = close.unwrap().0;
        let params = split_params(&rest[open + 1..close])
            .iter()
            .map(|p| rust_to_c(p.split_once(':').expect("name: type").1))
            .collect();
        let after = &rest[close + 1..rest.find('{').unwrap()];
        let ret = rust_to_c(after.trim().trim_start_matches("->"));
        sigs.insert(name, (ret, params));
    }
    sigs
}

#[test]
fn header_matches_exports() {
    let (h, r) = (header_sigs(), rust_sigs());
    assert!(h.len() >= 40, "parsed {} header prototypes", h.len());
    let only_h: Vec<_> = h.keys().filter(|k| !r.contains_key(*k)).collect();
    let only_r: Vec<_> = r.keys().filter(|k| !h.contains_key(*k)).collect();
    assert!(
        only_h.is_empty() && only_r.is_empty(),
        "declared only in the header: {only_h:?}; defined only in Rust: {only_r:?}"
    );
    for (name, sig) in &h {
        assert_eq!(sig, &r[name], "signature of {name}: header vs Rust");
    }
    // The functions the contract requires, with their exact C signatures (`;` separates
    // parameters).
    let required = [
        ("frt_ctx_create", "frt_ctx", ""),
        ("frt_ctx_destroy", "void", "frt_ctx"),
        ("frt_ctx_stream", "int", "frt_ctx;int"),
        ("frt_ctx_wrap_stream", "int", "frt_ctx;void*"),
        ("frt_ctx_event", "frt_event", "frt_ctx"),
        ("frt_event_destroy", "void", "frt_event"),
        ("frt_event_record", "int", "frt_event;int"),
        ("frt_stream_wait", "int", "frt_ctx;int;frt_event"),
        (
            "frt_buffer_alloc",
            "frt_buffer",
            "frt_ctx;const char*;size_t",
        ),
        (
            "frt_buffer_wrap",
            "frt_buffer",
            "frt_ctx;const char*;void*;size_t",
        ),
        ("frt_buffer_dptr", "void*", "frt_buffer"),
        ("frt_buffer_bytes", "size_t", "frt_buffer"),
        ("frt_buffer_name", "const char*", "frt_buffer"),
        (
            "frt_buffer_copy",
            "int",
            "frt_ctx;frt_buffer;size_t;frt_buffer;size_t;size_t;int",
        ),
        (
            "frt_graph_create",
            "frt_graph",
            "frt_ctx;const char*;size_t",
        ),
        ("frt_graph_destroy", "void", "frt_graph"),
        (
            "frt_graph_capture",
            "int",
            "frt_graph;frt_shape_key;void(*)(void*,void*);void*",
        ),
        ("frt_graph_adopt", "int", "frt_graph;frt_shape_key;void*"),
        ("frt_graph_bind", "int", "frt_graph;const char*;frt_buffer"),
        ("frt_graph_replay", "int", "frt_graph;frt_shape_key;int"),
        ("frt_graph_has_variant", "int", "frt_graph;frt_shape_key"),
        ("frt_graph_evict", "int", "frt_graph;frt_shape_key"),
        ("frt_graph_evict_lru", "int", "frt_graph"),
        ("frt_graph_variant_count", "size_t", "frt_graph"),
        ("frt_plan_create", "frt_plan", "frt_ctx"),
        ("frt_plan_destroy", "void", "frt_plan"),
        (
            "frt_plan_add",
            "int",
            "frt_plan;frt_graph;frt_shape_key;int",
        ),
        ("frt_plan_after", "int", "frt_plan;int;int"),
        ("frt_plan_execute", "int", "frt_plan;frt_shape_key"),
        ("frt_plan_sync", "int", "frt_plan"),
    ];
    for (name, ret, params) in required {
        let want: Vec<String> = params
            .split(';')
            .filter(|p| !p.is_empty())
            .map(String::from)
            .collect();
        assert_eq!(
            h.get(name),
            Some(&(ret.to_string(), want)),
            "required function {name}"
        );
    }
}

#[test]
fn status_codes_and_sentinel_match() {
    let text = strip_c_comments(HEADER);
    let body = &text[text.find("typedef enum {").unwrap()..text.find("} frt_status").unwrap()];
    let mut codes = BTreeMap::new();
    for item in body.trim_start_matches("typedef enum {").split(',') {
        let (k, v) = item.split_once('=').unwrap();
        codes.insert(k.trim().to_string(), v.trim().parse::<i32>().unwrap());
    }
    use flashrt_exec::*;
    let want = [
        ("FRT_OK", FRT_OK),
        ("FRT_ERR_INVALID", FRT_ERR_INVALID),
        ("FRT_ERR_NO_VARIANT", FRT_ERR_NO_VARIANT),
        ("FRT_ERR_UNBOUND", FRT_ERR_UNBOUND),
        ("FRT_ERR_CAPTURE", FRT_ERR_CAPTURE),
        ("FRT_ERR_BACKEND", FRT_ERR_BACKEND),
        ("FRT_ERR_OOM", FRT_ERR_OOM),
    ];
    assert_eq!(codes.len(), want.len());
    for (k, v) in want {
        assert_eq!(codes.get(k), Some(&v), "{k}");
    }
    assert_eq!(
        [
            FRT_OK,
            FRT_ERR_INVALID,
            FRT_ERR_NO_VARIANT,
            FRT_ERR_UNBOUND,
            FRT_ERR_CAPTURE,
            FRT_ERR_BACKEND,
            FRT_ERR_OOM
        ],
        [0, -1, -2, -3, -4, -5, -6]
    );
    assert!(HEADER.contains("#define FRT_KEY_INHERIT ((frt_shape_key)~0ull)"));
    assert_eq!(FRT_KEY_INHERIT, u64::MAX);
    assert_eq!(FRT_KEY_INHERIT, frt_exec::ShapeKey::INHERIT.0);
}
