//! The ROS 2 command-line arguments a node takes after `--ros-args` (as `ros2 run` and
//! `ros2 launch` pass them), for the transport that has no rcl to read them: parameters
//! (`-p name:=value`, `--params-file FILE`), the node's name and namespace (`-r __node:=`,
//! `-r __ns:=`) and topic remappings (`-r from:=to`). `--log-level` and `--enclave` are
//! accepted and ignored.

use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::path::Path;

/// What `--ros-args … [--]` said.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RosArgs {
    /// Parameter values as text (YAML scalars from a params file are given as written).
    pub params: BTreeMap<String, String>,
    pub node_name: Option<String>,
    pub namespace: Option<String>,
    /// Topic remappings, in order: (from, to).
    pub remaps: Vec<(String, String)>,
}

fn bad(what: &str, why: String) -> Error {
    Error::bad(what, why)
}

fn pair<'a>(flag: &str, s: &'a str) -> Result<(&'a str, &'a str)> {
    s.split_once(":=")
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| bad("--ros-args", format!("{flag} {s:?}: expected NAME:=VALUE")))
}

impl RosArgs {
    /// Parses every `--ros-args` section of `args` (a section ends at `--` or the end).
    /// `node`: the node's default name, to pick its section of a params file.
    pub fn parse(args: &[String], node: &str) -> Result<RosArgs> {
        let mut out = RosArgs::default();
        let mut files = Vec::new();
        let mut i = 0;
        let mut inside = false;
        while i < args.len() {
            let a = args[i].as_str();
            if a == "--ros-args" {
                inside = true;
            } else if a == "--" {
                inside = false;
            } else if inside {
                let mut value = || {
                    i += 1;
                    args.get(i)
                        .map(String::as_str)
                        .ok_or_else(|| bad("--ros-args", format!("{a} needs a value")))
                };
                match a {
                    "-p" | "--param" => {
                        let (k, v) = pair(a, value()?)?;
                        out.params.insert(k.to_string(), v.to_string());
                    }
                    "-r" | "--remap" => {
                        let (k, v) = pair(a, value()?)?;
                        match k {
                            "__node" | "__name" => out.node_name = Some(v.to_string()),
                            "__ns" => out.namespace = Some(v.to_string()),
                            _ => out.remaps.push((k.to_string(), v.to_string())),
                        }
                    }
                    "--params-file" => files.push(value()?.to_string()),
                    "--log-level" | "--enclave" | "-e" => {
                        value()?;
                    }
                    "--disable-rosout-logs"
                    | "--disable-stdout-logs"
                    | "--disable-external-lib-logs"
                    | "--enable-rosout-logs"
                    | "--enable-stdout-logs" => {}
                    _ => {
                        return Err(bad("--ros-args", format!("unsupported argument {a:?}")));
                    }
                }
            }
            i += 1;
        }
        // Files first, then `-p` on top (rcl's precedence).
        let name = out.node_name.clone().unwrap_or_else(|| node.to_string());
        let ns = out.namespace.clone().unwrap_or_default();
        let mut from_files = BTreeMap::new();
        for f in files {
            let text = std::fs::read_to_string(&f).map_err(|source| Error::Io {
                path: Path::new(&f).to_path_buf(),
                source,
            })?;
            params_file(&text, &name, &ns, &mut from_files)
                .map_err(|e| bad(&format!("params file {f}"), e))?;
        }
        from_files.append(&mut out.params);
        out.params = from_files;
        Ok(out)
    }

    /// A boolean parameter (`true`/`false`, as ROS 2 writes them).
    pub fn flag(&self, name: &str) -> Result<bool> {
        match self.params.get(name).map(|v| v.to_ascii_lowercase()) {
            None => Ok(false),
            Some(v) if v == "true" => Ok(true),
            Some(v) if v == "false" => Ok(false),
            Some(v) => Err(bad(
                &format!("parameter `{name}`"),
                format!("{v:?} is not true or false"),
            )),
        }
    }
}

/// Reads a ROS 2 parameters file: `<node>: ros__parameters: {…}` for the sections that apply
/// to this node (`/**`, its name, or its fully qualified name); nested maps become dotted names.
fn params_file(
    text: &str,
    node: &str,
    ns: &str,
    out: &mut BTreeMap<String, String>,
) -> std::result::Result<(), String> {
    let doc: serde_yaml::Value = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
    let Some(top) = doc.as_mapping() else {
        return Err("expected a mapping of node names".into());
    };
    let fq = format!("{}/{node}", ns.trim_end_matches('/'));
    let fq = if fq.starts_with('/') {
        fq
    } else {
        format!("/{fq}")
    };
    for (k, v) in top {
        let Some(k) = k.as_str() else { continue };
        let applies = k == "/**" || k == "**" || k == node || k == fq || k == &fq[1..];
        if !applies {
            continue;
        }
        let Some(p) = v.get("ros__parameters") else {
            return Err(format!("section `{k}` has no `ros__parameters`"));
        };
        flatten("", p, out)?;
    }
    Ok(())
}

fn flatten(
    prefix: &str,
    v: &serde_yaml::Value,
    out: &mut BTreeMap<String, String>,
) -> std::result::Result<(), String> {
    use serde_yaml::Value as V;
    match v {
        V::Mapping(m) => {
            for (k, v) in m {
                let k = k.as_str().ok_or("a parameter name is not a string")?;
                let name = if prefix.is_empty() {
                    k.to_string()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&name, v, out)?;
            }
        }
        V::String(s) => {
            out.insert(prefix.to_string(), s.clone());
        }
        V::Bool(b) => {
            out.insert(prefix.to_string(), b.to_string());
        }
        V::Number(n) => {
            out.insert(prefix.to_string(), n.to_string());
        }
        other => {
            let text = serde_yaml::to_string(other).map_err(|e| e.to_string())?;
            out.insert(prefix.to_string(), text.trim().to_string());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parameters_names_and_remaps() {
        let dir = std::env::temp_dir().join(format!("frt-ros-args-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("params.yaml");
        // As launch_ros writes `parameters=[{…}]`.
        std::fs::write(
            &f,
            "/**:\n  ros__parameters:\n    config: /a.yaml\n    use_sim_time: true\n\
             other_node:\n  ros__parameters:\n    config: /wrong.yaml\n\
             /robot1/arm_host:\n  ros__parameters:\n    gains: {p: 2.5}\n",
        )
        .unwrap();
        let a = RosArgs::parse(
            &args(&format!(
                "ros --dds --ros-args -r __node:=arm_host -r __ns:=/robot1 --params-file {} \
                 -p use_sim_time:=false --log-level info -r /cam:=/camera/image_raw --",
                f.display()
            )),
            "frt_robot_host",
        )
        .unwrap();
        assert_eq!(a.params["config"], "/a.yaml");
        assert_eq!(a.params["gains.p"], "2.5");
        assert!(!a.flag("use_sim_time").unwrap(), "-p overrides the file");
        assert_eq!(a.node_name.as_deref(), Some("arm_host"));
        assert_eq!(a.namespace.as_deref(), Some("/robot1"));
        assert_eq!(a.remaps, vec![("/cam".into(), "/camera/image_raw".into())]);

        let e = RosArgs::parse(&args("--ros-args -p config"), "n").unwrap_err();
        assert!(e.to_string().contains("NAME:=VALUE"), "{e}");
        let e = RosArgs::parse(&args("--ros-args --bogus"), "n").unwrap_err();
        assert!(e.to_string().contains("--bogus"), "{e}");
        let e = RosArgs::parse(&args("--ros-args -p x:=maybe"), "n")
            .unwrap()
            .flag("x")
            .unwrap_err();
        assert!(e.to_string().contains("maybe"), "{e}");
        std::fs::write(&f, "/**:\n  config: x\n").unwrap();
        let e = RosArgs::parse(
            &args(&format!("--ros-args --params-file {}", f.display())),
            "n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("ros__parameters"), "{e}");
        // Outside `--ros-args` nothing is read.
        assert_eq!(
            RosArgs::parse(&args("-p a:=b"), "n").unwrap(),
            RosArgs::default()
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
