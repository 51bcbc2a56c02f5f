//! Dimensions of openpi's Pi0 family (`pi0_config.Pi0Config`, `gemma.get_config`, `siglip`
//! So400m/14): Pi0.5 (`pi05=True`) and Pi0, with full-size presets and tiny ones for CI.

use serde::{Deserialize, Serialize};

/// SigLIP vision tower (openpi `siglip.Module`, `variant="So400m/14"`, `pool_type="none"`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiglipConfig {
    pub image_size: usize,
    pub patch: usize,
    /// `width`
    pub width: usize,
    /// `depth`
    pub depth: usize,
    /// `mlp_dim`
    pub mlp: usize,
    /// `num_heads`
    pub heads: usize,
}

impl SiglipConfig {
    pub fn tokens(&self) -> usize {
        (self.image_size / self.patch).pow(2)
    }
    pub fn head_dim(&self) -> usize {
        self.width / self.heads
    }
}

/// A Gemma stack (openpi `gemma.Config`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GemmaConfig {
    pub width: usize,
    pub depth: usize,
    /// `mlp_dim`
    pub mlp: usize,
    /// `num_heads`
    pub heads: usize,
    /// `num_kv_heads`
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl GemmaConfig {
    /// The layer shapes of this stack, as the shared Gemma blocks take them.
    pub fn dims(&self) -> frt_nn::blocks::gemma::GemmaDims {
        frt_nn::blocks::gemma::GemmaDims {
            width: self.width,
            mlp: self.mlp,
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
        }
    }
}

/// The most camera views a model may have (inputs are gathered on the stack).
pub const MAX_VIEWS: usize = 8;

/// Which model of openpi's Pi0 family (`pi05` in openpi's `Pi0Config`). The two share the
/// vision tower, the language model and the flow-matching loop; they differ in the action
/// expert's input and norms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Variant {
    /// Pi0.5: the state discretized into the prompt, the expert's norms adaptive (scale,
    /// shift and gate from the flow-matching time).
    #[default]
    Pi05,
    /// Pi0: the state as one continuous token in front of the action tokens (`state_proj`),
    /// the time mixed into each action token by an MLP (`action_time_mlp_{in,out}`), plain
    /// RMSNorm in the expert, the prompt without the state.
    Pi0,
}

impl Variant {
    /// How the model takes the robot state.
    pub fn state_input(self) -> crate::policy::StateInput {
        match self {
            Variant::Pi05 => crate::policy::StateInput::Prompt,
            Variant::Pi0 => crate::policy::StateInput::Token,
        }
    }

    /// The model's name for people.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Pi05 => "Pi0.5",
            Variant::Pi0 => "Pi0",
        }
    }
}

/// The whole policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pi05Config {
    /// Pi0.5 or Pi0 (absent in a `config.json`: Pi0.5).
    #[serde(default)]
    pub variant: Variant,
    pub siglip: SiglipConfig,
    /// The PaliGemma language model (`paligemma_variant`, "gemma_2b").
    pub llm: GemmaConfig,
    /// The action expert (`action_expert_variant`, "gemma_300m").
    pub expert: GemmaConfig,
    /// PaliGemma vocabulary size.
    pub vocab: usize,
    /// `action_dim`
    pub action_dim: usize,
    /// `action_horizon`
    pub action_horizon: usize,
    /// `max_token_len` (prompt tokens)
    pub max_token_len: usize,
    /// Camera views (`base_0_rgb`, `left_wrist_0_rgb`, `right_wrist_0_rgb`), at most
    /// [`MAX_VIEWS`].
    pub views: usize,
    /// Flow-matching Euler steps.
    pub steps: usize,
}

impl Pi05Config {
    /// openpi's `pi05` at full size.
    pub fn base() -> Pi05Config {
        Pi05Config {
            variant: Variant::Pi05,
            siglip: SiglipConfig {
                image_size: 224,
                patch: 14,
                width: 1152,
                depth: 27,
                mlp: 4304,
                heads: 16,
            },
            llm: GemmaConfig {
                width: 2048,
                depth: 18,
                mlp: 16_384,
                heads: 8,
                kv_heads: 1,
                head_dim: 256,
            },
            expert: GemmaConfig {
                width: 1024,
                depth: 18,
                mlp: 4096,
                heads: 8,
                kv_heads: 1,
                head_dim: 256,
            },
            vocab: 257_152,
            action_dim: 32,
            action_horizon: 50,
            max_token_len: 200,
            views: 3,
            steps: 10,
        }
    }

    /// openpi's `dummy` Gemma for both stacks, a small SigLIP and vocabulary: the same
    /// structure, small enough for the host backend in CI.
    pub fn tiny() -> Pi05Config {
        let dummy = GemmaConfig {
            width: 64,
            depth: 4,
            mlp: 128,
            heads: 8,
            kv_heads: 1,
            head_dim: 16,
        };
        Pi05Config {
            variant: Variant::Pi05,
            siglip: SiglipConfig {
                image_size: 224,
                patch: 14,
                width: 64,
                depth: 2,
                mlp: 128,
                heads: 4,
            },
            llm: dummy.clone(),
            expert: dummy,
            vocab: 1024,
            action_dim: 32,
            action_horizon: 50,
            max_token_len: 48,
            views: 3,
            steps: 10,
        }
    }

    /// openpi's `pi0` at full size (Pi0's prompt capacity is 48 tokens: no state in it).
    pub fn pi0_base() -> Pi05Config {
        Pi05Config {
            variant: Variant::Pi0,
            max_token_len: 48,
            ..Pi05Config::base()
        }
    }

    /// [`tiny`](Self::tiny) as a Pi0.
    pub fn pi0_tiny() -> Pi05Config {
        Pi05Config {
            variant: Variant::Pi0,
            ..Pi05Config::tiny()
        }
    }

    /// Rows the action expert runs over: the action tokens, behind Pi0's state token.
    pub fn suffix_len(&self) -> usize {
        self.action_horizon + usize::from(self.variant == Variant::Pi0)
    }

    /// Prefix capacity: every view's image tokens and the prompt.
    pub fn prefix_len(&self) -> usize {
        self.views * self.siglip.tokens() + self.max_token_len
    }

    /// Checks the invariants the model relies on; names what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        let s = &self.siglip;
        if s.patch == 0 || s.image_size % s.patch != 0 || s.heads == 0 || s.width % s.heads != 0 {
            return Err(format!(
                "siglip: image {} / patch {} / width {} / heads {} do not divide",
                s.image_size, s.patch, s.width, s.heads
            ));
        }
        for (name, g) in [("llm", &self.llm), ("expert", &self.expert)] {
            if g.kv_heads == 0 || g.heads % g.kv_heads != 0 || g.head_dim % 2 != 0 {
                return Err(format!(
                    "{name}: heads {} over kv heads {} with head_dim {}",
                    g.heads, g.kv_heads, g.head_dim
                ));
            }
        }
        if self.llm.depth != self.expert.depth
            || self.llm.heads != self.expert.heads
            || self.llm.kv_heads != self.expert.kv_heads
            || self.llm.head_dim != self.expert.head_dim
        {
            return Err("the language model and the action expert must share depth, heads, kv heads and head_dim (their attention is joint)".into());
        }
        if self.views == 0
            || self.action_horizon == 0
            || self.action_dim == 0
            || self.max_token_len == 0
            || self.steps == 0
        {
            return Err(
                "views, action_horizon, action_dim, max_token_len and steps must be positive"
                    .into(),
            );
        }
        if self.views > MAX_VIEWS {
            return Err(format!("{} views (at most {MAX_VIEWS})", self.views));
        }
        Ok(())
    }
}
