/* tokenizer.h — tokenizers in C (engine/io): SentencePiece (tokenizer.model, Gemma/Mistral).
 * Ids are 0-based everywhere. Strings are UTF-8 byte runs with explicit lengths. See
 * docs/tokenizers.md for what is supported and how the output matches the reference. */
#ifndef KENG_TOKENIZER_H
#define KENG_TOKENIZER_H

#include <keng/keng.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- SentencePiece (engine/io/sentencepiece.c) ------------------------------------------ */

typedef struct kg_sentencepiece kg_sentencepiece;

/* Reads a serialized sentencepiece ModelProto (`tokenizer.model`). [out] *out, free with
 * kg_sentencepiece_free. A corrupt or unsupported file fails with KG_ERR_IO. */
kg_status kg_sentencepiece_load(kg_sentencepiece **out, const char *path);
/* The same from bytes in memory (copied; `label` names the source in error messages). */
kg_status kg_sentencepiece_parse(kg_sentencepiece **out, const void *data, size_t len, const char *label);
void kg_sentencepiece_free(kg_sentencepiece *sp);

/* text[0..len) -> ids [out] *ids (malloc'd, free with free(); NULL when *n_ids is 0). Matches
 * SentencePieceProcessor::EncodeAsIds; invalid UTF-8 bytes become U+FFFD as the reference does. */
kg_status kg_sentencepiece_encode(const kg_sentencepiece *sp, const char *text, size_t len, int32_t **ids,
                                  size_t *n_ids);
/* ids[0..n) -> [out] *text (malloc'd, NUL-terminated, free with free()), *len bytes. An id
 * outside [0, vocab_size) fails with KG_ERR_VALUE naming it. */
kg_status kg_sentencepiece_decode(const kg_sentencepiece *sp, const int32_t *ids, size_t n, char **text, size_t *len);

int kg_sentencepiece_vocab_size(const kg_sentencepiece *sp);
/* The piece of id (not NUL-terminated copy: *len bytes), or NULL when id is out of range. */
const char *kg_sentencepiece_id_to_piece(const kg_sentencepiece *sp, int id, size_t *len);
/* The id of piece[0..len), or the unk id when absent (as the reference). */
int kg_sentencepiece_piece_to_id(const kg_sentencepiece *sp, const char *piece, size_t len);

typedef struct {
  int vocab_size;
  int unk_id, bos_id, eos_id, pad_id; /* -1 when the model has none */
  int model_type;                     /* 1 unigram, 2 bpe */
  bool byte_fallback;
  bool add_dummy_prefix, remove_extra_whitespaces, escape_whitespaces;
  bool has_charsmap; /* a precompiled normalization map (nmt_nfkc, ...) is applied */
} kg_sentencepiece_info;
kg_sentencepiece_info kg_sentencepiece_get_info(const kg_sentencepiece *sp);

#ifdef __cplusplus
}
#endif

#endif
