//! The configuration as ROS 2 parameters: every field is a parameter of its dotted name
//! (`control.rate_hz`, `cameras.0.topic`, `safety.action_max`), typed as ROS 2 types it
//! (bool, integer, double, string, arrays of one of them; an absent optional field is "not
//! set"). A transport serves them with ROS 2's parameter services.
//!
//! The action limits and delta caps (`safety.action_min`, `safety.action_max`,
//! `safety.max_delta_per_step`, `actions.<k>.min|max|max_delta`) and the observation age
//! bound (`safety.max_observation_age_ms`) may be set while the node runs: the whole
//! configuration with the change is validated, and the control thread takes it between two
//! ticks ([`crate::Inputs::reconfigure`]). So may `model.calibration` of a `precision: fp8`
//! node: the file is read and checked against the model when set, and its scales are written
//! into the model's buffers between two ticks (no recapture). Every other field is read-only while running; a set
//! is refused with the reason (it is read at start-up: `-p` or `--params-file` change it).

use crate::config::Config;
use serde_yaml::Value;

/// A parameter's value, as ROS 2 types parameters.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamValue {
    NotSet,
    Bool(bool),
    Integer(i64),
    Double(f64),
    String(String),
    BoolArray(Vec<bool>),
    IntegerArray(Vec<i64>),
    DoubleArray(Vec<f64>),
    StringArray(Vec<String>),
}

impl ParamValue {
    /// `rcl_interfaces/msg/ParameterType`'s constant.
    pub fn type_id(&self) -> u8 {
        match self {
            ParamValue::NotSet => 0,
            ParamValue::Bool(_) => 1,
            ParamValue::Integer(_) => 2,
            ParamValue::Double(_) => 3,
            ParamValue::String(_) => 4,
            ParamValue::BoolArray(_) => 6,
            ParamValue::IntegerArray(_) => 7,
            ParamValue::DoubleArray(_) => 8,
            ParamValue::StringArray(_) => 9,
        }
    }

    fn type_name(&self) -> &'static str {
        match self {
            ParamValue::NotSet => "not set",
            ParamValue::Bool(_) => "a bool",
            ParamValue::Integer(_) => "an integer",
            ParamValue::Double(_) => "a double",
            ParamValue::String(_) => "a string",
            ParamValue::BoolArray(_) => "a bool array",
            ParamValue::IntegerArray(_) => "an integer array",
            ParamValue::DoubleArray(_) => "a double array",
            ParamValue::StringArray(_) => "a string array",
        }
    }

    /// The scalar or list of scalars a YAML value is (`None`: a mapping, a list of mappings,
    /// or a list mixing kinds).
    fn of_yaml(v: &Value) -> Option<ParamValue> {
        Some(match v {
            Value::Null => ParamValue::NotSet,
            Value::Bool(b) => ParamValue::Bool(*b),
            Value::Number(n) => match n.as_i64() {
                Some(i) => ParamValue::Integer(i),
                None => ParamValue::Double(n.as_f64()?),
            },
            Value::String(s) => ParamValue::String(s.clone()),
            Value::Sequence(items) => {
                if items.iter().all(Value::is_bool) {
                    ParamValue::BoolArray(items.iter().filter_map(Value::as_bool).collect())
                } else if items.iter().all(Value::is_i64) {
                    ParamValue::IntegerArray(items.iter().filter_map(Value::as_i64).collect())
                } else if items.iter().all(Value::is_number) {
                    ParamValue::DoubleArray(items.iter().filter_map(Value::as_f64).collect())
                } else if items.iter().all(Value::is_string) {
                    ParamValue::StringArray(
                        items
                            .iter()
                            .filter_map(|s| s.as_str().map(String::from))
                            .collect(),
                    )
                } else {
                    return None;
                }
            }
            _ => return None,
        })
    }

    pub fn to_yaml(&self) -> Value {
        let seq = |v: Vec<Value>| Value::Sequence(v);
        match self {
            ParamValue::NotSet => Value::Null,
            ParamValue::Bool(b) => Value::Bool(*b),
            ParamValue::Integer(i) => Value::from(*i),
            ParamValue::Double(d) => Value::from(*d),
            ParamValue::String(s) => Value::String(s.clone()),
            ParamValue::BoolArray(v) => seq(v.iter().map(|b| Value::Bool(*b)).collect()),
            ParamValue::IntegerArray(v) => seq(v.iter().map(|i| Value::from(*i)).collect()),
            ParamValue::DoubleArray(v) => seq(v.iter().map(|d| Value::from(*d)).collect()),
            ParamValue::StringArray(v) => seq(v.iter().map(|s| Value::String(s.clone())).collect()),
        }
    }

    /// `self` as the declared kind of `like`: the same kind, or an integer (array) for a
    /// double (array). An empty array takes any array kind.
    fn conform(self, like: &ParamValue) -> Option<ParamValue> {
        use ParamValue as P;
        Some(match (self, like) {
            (P::Integer(i), P::Double(_)) => P::Double(i as f64),
            (P::IntegerArray(v), P::DoubleArray(_)) => {
                P::DoubleArray(v.into_iter().map(|i| i as f64).collect())
            }
            (v, l) if std::mem::discriminant(&v) == std::mem::discriminant(l) => v,
            (v, l) if v.is_array() && l.is_empty_array() => v,
            // An optional field not set takes any value; the configuration's check decides.
            (v, P::NotSet) => v,
            _ => return None,
        })
    }

    fn is_array(&self) -> bool {
        self.array_len().is_some()
    }

    fn is_empty_array(&self) -> bool {
        self.array_len() == Some(0)
    }

    fn array_len(&self) -> Option<usize> {
        match self {
            ParamValue::BoolArray(a) => Some(a.len()),
            ParamValue::IntegerArray(a) => Some(a.len()),
            ParamValue::DoubleArray(a) => Some(a.len()),
            ParamValue::StringArray(a) => Some(a.len()),
            _ => None,
        }
    }
}

/// A parameter's description (`ros2 param describe`).
#[derive(Clone, Debug, PartialEq)]
pub struct Descriptor {
    pub name: String,
    pub type_id: u8,
    pub description: String,
    pub read_only: bool,
}

/// Whether a field may be set while the node runs.
pub fn is_live(name: &str) -> bool {
    let parts: Vec<&str> = name.split('.').collect();
    match parts.as_slice() {
        ["safety", f] => matches!(
            *f,
            "action_min" | "action_max" | "max_delta_per_step" | "max_observation_age_ms"
        ),
        ["actions", k, f] => {
            k.parse::<usize>().is_ok() && matches!(*f, "min" | "max" | "max_delta")
        }
        ["model", "calibration"] => true,
        _ => false,
    }
}

/// The node's parameters: the configuration in effect as a YAML document and its flat list.
pub struct Parameters {
    doc: Value,
    list: Vec<(String, ParamValue)>,
}

fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, ParamValue)>) {
    let name = |k: &str| {
        if prefix.is_empty() {
            k.to_string()
        } else {
            format!("{prefix}.{k}")
        }
    };
    match v {
        Value::Mapping(m) => {
            for (k, v) in m {
                if let Some(k) = k.as_str() {
                    flatten(&name(k), v, out);
                }
            }
        }
        Value::Sequence(items) if ParamValue::of_yaml(v).is_none() => {
            for (i, v) in items.iter().enumerate() {
                flatten(&name(&i.to_string()), v, out);
            }
        }
        Value::Tagged(t) => flatten(prefix, &t.value, out),
        v => {
            if let Some(p) = ParamValue::of_yaml(v) {
                out.push((prefix.to_string(), p));
            }
        }
    }
}

impl Parameters {
    /// The parameters of a configuration (every field, defaults included).
    pub fn new(config: &Config) -> Parameters {
        let doc = serde_yaml::to_value(config).unwrap_or(Value::Null);
        let mut list = Vec::new();
        flatten("", &doc, &mut list);
        Parameters { doc, list }
    }

    /// Every parameter's name, in the configuration's order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.list.iter().map(|(n, _)| n.as_str())
    }

    /// `ros2 param list`: names under any of `prefixes` (all when empty) at most `depth` dots
    /// below the prefix (0: any depth); the prefixes of the names returned.
    pub fn list(&self, prefixes: &[String], depth: u64) -> (Vec<String>, Vec<String>) {
        let mut names = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for (n, _) in &self.list {
            let under = prefixes.is_empty()
                || prefixes
                    .iter()
                    .any(|p| n == p || n.starts_with(&format!("{p}.")));
            if !under {
                continue;
            }
            let base = prefixes
                .iter()
                .filter(|p| n.starts_with(&format!("{p}.")))
                .map(|p| p.len() + 1)
                .max()
                .unwrap_or(0);
            let dots = n[base..].matches('.').count() as u64;
            if depth != 0 && dots >= depth {
                continue;
            }
            names.push(n.clone());
            if let Some((p, _)) = n.rsplit_once('.') {
                seen.insert(p.to_string());
            }
        }
        (names, seen.into_iter().collect())
    }

    /// The value of each name (`NotSet` for a name that is no parameter, as ROS 2 answers).
    pub fn get(&self, name: &str) -> Option<&ParamValue> {
        self.list.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    pub fn describe(&self, name: &str) -> Descriptor {
        let (type_id, description, read_only) = match self.get(name) {
            None => (0, "not a parameter of this node".to_string(), true),
            Some(v) if is_live(name) => (
                v.type_id(),
                "configuration field; may be set while running (taken between two ticks)".into(),
                false,
            ),
            Some(v) => (
                v.type_id(),
                "configuration field; read at start-up (set it with -p or --params-file)".into(),
                true,
            ),
        };
        Descriptor {
            name: name.to_string(),
            type_id,
            description,
            read_only,
        }
    }

    /// Checks a set of changes as one: each name a live field, each value of its kind, and
    /// the configuration with all of them valid. Returns that configuration (not applied
    /// here); `Err` names the first problem.
    pub fn check(&self, changes: &[(String, ParamValue)]) -> Result<Config, String> {
        let mut doc = self.doc.clone();
        for (name, value) in changes {
            let Some(current) = self.get(name) else {
                return Err(format!("`{name}` is not a parameter of this node"));
            };
            if !is_live(name) {
                return Err(format!(
                    "`{name}` is read-only while the node runs: it is read at start-up \
                     (set it with -p or --params-file and restart)"
                ));
            }
            let kind = value.type_name();
            let v = value
                .clone()
                .conform(current)
                .ok_or_else(|| format!("`{name}` is {}, not {kind}", current.type_name()))?;
            crate::config::set_path(&mut doc, name, v.to_yaml())
                .map_err(|e| format!("`{name}`: {e}"))?;
        }
        // Paths in the document are already resolved (it is the configuration in effect).
        let c: Config = serde_yaml::from_value(doc).map_err(|e| e.to_string())?;
        c.validate().map_err(|e| e.to_string())?;
        c.action_dims().map_err(|e| e.to_string())?;
        Ok(c)
    }

    /// Takes a configuration [`Parameters::check`] returned as the one in effect.
    pub fn commit(&mut self, config: &Config) {
        *self = Parameters::new(config);
    }

    /// Sets `changes` as one (what a parameter service's set does): checked, handed to the
    /// running node (taken between two ticks), then in effect here; recorded into `tap` (the
    /// configuration in effect). `Err`: the reason nothing was set.
    pub fn apply(
        &mut self,
        inputs: &crate::Inputs,
        changes: &[(String, ParamValue)],
        tap: Option<&crate::record::Tap>,
    ) -> Result<(), String> {
        let c = self.check(changes)?;
        let reload = changes.iter().any(|(n, _)| n == "model.calibration");
        inputs
            .reconfigure(c.clone(), reload)
            .map_err(|e| e.to_string())?;
        if let Some(tap) = tap {
            tap.configuration(inputs.now(), &c);
        }
        self.commit(&c);
        let names: Vec<&str> = changes.iter().map(|(n, _)| n.as_str()).collect();
        tracing::info!(parameters = ?names, "parameters set");
        Ok(())
    }

    /// Each parameter with whether it may be set while running.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &ParamValue, bool)> {
        self.list.iter().map(|(n, v)| (n.as_str(), v, is_live(n)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = r#"
model: { random: { size: tiny, seed: 3 }, precision: f32, backend: host, max_token_len: 96 }
cameras:
  - { name: base, topic: /base/image_raw, format: raw, view: 0 }
state: { topic: /joint_states, joints: [j1, j2] }
control: { rate_hz: 10, initial_subgoal: wave, action_dim: 2, dt: 0.02 }
safety:
  max_observation_age_ms: 200
  missing_camera: halt
  action_space: position
  action_min: [-2.0]
  action_max: [2.0]
"#;

    fn params() -> Parameters {
        Parameters::new(&Config::parse(CONFIG).unwrap())
    }

    #[test]
    fn every_field_is_a_typed_parameter() {
        let p = params();
        assert_eq!(p.get("control.rate_hz"), Some(&ParamValue::Double(10.0)));
        assert_eq!(p.get("control.action_dim"), Some(&ParamValue::Integer(2)));
        assert_eq!(
            p.get("cameras.0.topic"),
            Some(&ParamValue::String("/base/image_raw".into()))
        );
        assert_eq!(
            p.get("state.joints"),
            Some(&ParamValue::StringArray(vec!["j1".into(), "j2".into()]))
        );
        assert_eq!(
            p.get("safety.action_max"),
            Some(&ParamValue::DoubleArray(vec![2.0]))
        );
        // Defaults are parameters too; absent options are not set.
        assert_eq!(p.get("ros.status_period_s"), Some(&ParamValue::Double(1.0)));
        assert_eq!(
            p.get("safety.max_delta_per_step"),
            Some(&ParamValue::NotSet)
        );
        assert!(p.names().count() > 40, "{}", p.names().count());
        let (names, prefixes) = p.list(&["control".into()], 1);
        assert!(names.contains(&"control.rate_hz".to_string()));
        assert!(names.iter().all(|n| n.starts_with("control.")));
        assert_eq!(prefixes, ["control"]);
    }

    #[test]
    fn live_fields_are_checked_as_a_whole_and_others_are_refused() {
        let p = params();
        let set = |n: &str, v: ParamValue| p.check(&[(n.to_string(), v)]);
        let c = set("safety.action_max", ParamValue::DoubleArray(vec![1.5])).unwrap();
        assert_eq!(c.safety.action_max.as_deref(), Some(&[1.5][..]));
        // An integer array for a double array.
        assert!(set("safety.action_max", ParamValue::IntegerArray(vec![1])).is_ok());
        let e = set("safety.action_max", ParamValue::String("1".into())).unwrap_err();
        assert!(e.contains("is a double array, not a string"), "{e}");
        let e = set("safety.action_max", ParamValue::DoubleArray(vec![-3.0])).unwrap_err();
        assert!(e.contains("safety."), "below the minimum is invalid: {e}");
        let e = set("model.precision", ParamValue::String("bf16".into())).unwrap_err();
        assert!(e.contains("read-only while the node runs"), "{e}");
        let e = set("nope", ParamValue::Integer(1)).unwrap_err();
        assert!(e.contains("not a parameter"), "{e}");
        // Optional and unset: takes a value.
        let c = set(
            "safety.max_delta_per_step",
            ParamValue::DoubleArray(vec![0.1]),
        )
        .unwrap();
        assert!(c.safety.max_delta_per_step.is_some());
        assert!(!p.describe("safety.action_min").read_only);
        assert!(p.describe("control.rate_hz").read_only);
    }
}
