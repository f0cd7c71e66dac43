/*
 * tokenizer-synth.h - a small Hugging Face tokenizer.json for the models
 * dgemma generates (the embedded default model), in the Gemma layout:
 * BPE with byte fallback, spaces normalised to "▁" (U+2581), <bos> added by
 * the post-processor, and a decoder that undoes both.
 *
 * Vocabulary, in id order: <pad> <eos> <bos> <unk> <mask> <|turn> <turn|>
 * <|think|> <|channel> <channel|> (ids 0-9; all special but <mask>), the
 * 256 byte tokens <0x00>..<0xFF>, "▁", the printable ASCII characters, the
 * pieces of a fixed list of common English merges, and <unusedN> added
 * tokens up to the requested size.  The chat tokens follow the
 * DiffusionGemma / Gemma 4 turn format (model.md §8).  Also writes a
 * tokenizer_config.json (add_bos_token true).
 */
#ifndef DG_TOKENIZER_SYNTH_H
#define DG_TOKENIZER_SYNTH_H

#include <stdint.h>

#include "lib/error.h"

#define DG_TOKSYNTH_N_SPECIAL 10
#define DG_TOKSYNTH_MIN_VOCAB (DG_TOKSYNTH_N_SPECIAL + 256 + 1 + 94) /* 361 */

/* Write dir/tokenizer.json and dir/tokenizer_config.json for a model with
 * vocab_size ids.  Errors: DG_E_INVAL (vocab_size below 361), DG_E_IO,
 * DG_E_NOMEM. */
int dg_tokenizer_synth_write(const char *dir, int64_t vocab_size, struct dg_error *err);

#endif
