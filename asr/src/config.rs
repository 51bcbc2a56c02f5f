//! Whisper model dimensions, with presets for the released sizes.

use serde::{Deserialize, Serialize};

/// The dimensions of a Whisper model. Field comments give the names openai/whisper's
/// `ModelDimensions` and Hugging Face's `WhisperConfig` use.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WhisperConfig {
    /// `n_mels` / `num_mel_bins`
    pub n_mels: usize,
    /// `n_audio_ctx` / `max_source_positions` (1500 frames after the stride-2 conv)
    pub n_audio_ctx: usize,
    /// `n_audio_state` / `d_model`
    pub n_audio_state: usize,
    /// `n_audio_head` / `encoder_attention_heads`
    pub n_audio_head: usize,
    /// `n_audio_layer` / `encoder_layers`
    pub n_audio_layer: usize,
    /// `n_vocab` / `vocab_size`
    pub n_vocab: usize,
    /// `n_text_ctx` / `max_target_positions`
    pub n_text_ctx: usize,
    /// `n_text_state` / `d_model`
    pub n_text_state: usize,
    /// `n_text_head` / `decoder_attention_heads`
    pub n_text_head: usize,
    /// `n_text_layer` / `decoder_layers`
    pub n_text_layer: usize,
}

impl WhisperConfig {
    /// Refuses sizes no Whisper model has (a corrupt file), before anything is allocated from
    /// them: the reason names the field.
    pub fn check(&self) -> std::result::Result<(), String> {
        let within = |name: &str, v: usize, lo: usize, hi: usize| {
            if (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(format!("{name} = {v}; expected {lo} to {hi}"))
            }
        };
        within("n_mels", self.n_mels, 1, 256)?;
        within("n_audio_ctx", self.n_audio_ctx, 1, 1500)?;
        within("n_audio_state", self.n_audio_state, 1, 8192)?;
        within("n_audio_head", self.n_audio_head, 1, 128)?;
        within("n_audio_layer", self.n_audio_layer, 1, 128)?;
        within("n_vocab", self.n_vocab, 1, 1 << 20)?;
        within("n_text_ctx", self.n_text_ctx, 1, 4096)?;
        within("n_text_state", self.n_text_state, 1, 8192)?;
        within("n_text_head", self.n_text_head, 1, 128)?;
        within("n_text_layer", self.n_text_layer, 1, 128)?;
        for (name, w, h) in [
            ("n_audio_state", self.n_audio_state, self.n_audio_head),
            ("n_text_state", self.n_text_state, self.n_text_head),
        ] {
            if w % h != 0 {
                return Err(format!("{name} = {w} is not a multiple of {h} heads"));
            }
        }
        Ok(())
    }

    fn sized(state: usize, heads: usize, layers: usize, english_only: bool) -> WhisperConfig {
        WhisperConfig {
            n_mels: 80,
            n_audio_ctx: 1500,
            n_audio_state: state,
            n_audio_head: heads,
            n_audio_layer: layers,
            n_vocab: if english_only { 51864 } else { 51865 },
            n_text_ctx: 448,
            n_text_state: state,
            n_text_head: heads,
            n_text_layer: layers,
        }
    }
    pub fn tiny_en() -> Self {
        Self::sized(384, 6, 4, true)
    }
    pub fn tiny() -> Self {
        Self::sized(384, 6, 4, false)
    }
    pub fn base_en() -> Self {
        Self::sized(512, 8, 6, true)
    }
    pub fn base() -> Self {
        Self::sized(512, 8, 6, false)
    }
    pub fn small_en() -> Self {
        Self::sized(768, 12, 12, true)
    }
    pub fn small() -> Self {
        Self::sized(768, 12, 12, false)
    }

    /// Multilingual models have a vocabulary with language tokens (51865 entries).
    pub fn is_multilingual(&self) -> bool {
        self.n_vocab >= 51865
    }

    /// The preset these dimensions equal, if any.
    pub fn preset_name(&self) -> Option<&'static str> {
        [
            ("tiny.en", Self::tiny_en()),
            ("tiny", Self::tiny()),
            ("base.en", Self::base_en()),
            ("base", Self::base()),
            ("small.en", Self::small_en()),
            ("small", Self::small()),
        ]
        .into_iter()
        .find(|(_, c)| c == self)
        .map(|(n, _)| n)
    }
}
