/* tokenizer_json.h — Hugging Face `tokenizers` pipelines read from a tokenizer.json
 * (engine/io/tokenizer_json*.c, docs/tokenizers.md): added tokens, normalizer, pre-tokenizer,
 * model (BPE, WordPiece, Unigram, WordLevel), post-processor and decoder, id for id with the reference
 * library's Tokenizer.encode / decode. Ids are 0-based; strings are UTF-8 with explicit lengths.
 * A component or key the file uses and keng does not implement fails the load, naming it. */
#ifndef KENG_TOKENIZER_JSON_H
#define KENG_TOKENIZER_JSON_H

#include <keng/keng.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kg_tokenizer_json kg_tokenizer_json;

/* Reads a tokenizer.json. [out] *out, free with kg_tokenizer_json_free. KG_ERR_IO on a file
 * that is not one, KG_ERR_VALUE naming the component or key keng does not implement. */
kg_status kg_tokenizer_json_load(kg_tokenizer_json **out, const char *path);
/* The same from bytes in memory (label names the source in messages). */
kg_status kg_tokenizer_json_parse(kg_tokenizer_json **out, const char *json, size_t len, const char *label);
void kg_tokenizer_json_free(kg_tokenizer_json *t);

/* text[0..len) -> [out] *ids (malloc'd, free(); NULL when *n is 0): added tokens, normalizer,
 * pre-tokenizer and model, without the post-processor's special tokens. Text that is not
 * UTF-8 fails with KG_ERR_VALUE. */
kg_status kg_tokenizer_json_encode(const kg_tokenizer_json *t, const char *text, size_t len, int32_t **ids, size_t *n);
/* The post-processor over a (and b when nb > 0 or b != NULL): [out] *ids and *type_ids
 * (malloc'd, free()), *n of them. With add_special false, a and b are only joined. */
kg_status kg_tokenizer_json_post_process(const kg_tokenizer_json *t, const int32_t *a, size_t na, const int32_t *b,
                                         size_t nb, bool pair, bool add_special, int32_t **ids, int32_t **type_ids,
                                         size_t *n);
/* How many ids the post-processor adds to one sequence (pair false) or a pair. */
size_t kg_tokenizer_json_num_special(const kg_tokenizer_json *t, bool pair);
/* ids[0..n) -> [out] *text (malloc'd, NUL-terminated, free()), *len bytes, through the decoder;
 * skip_special drops the special added tokens. An id outside [0, vocab_size) fails naming it. */
kg_status kg_tokenizer_json_decode(const kg_tokenizer_json *t, const int32_t *ids, size_t n, bool skip_special,
                                   char **text, size_t *len);

/* The vocabulary size, added tokens included. */
int64_t kg_tokenizer_json_vocab_size(const kg_tokenizer_json *t);
/* The id of token s[0..n) (added tokens first, then the model), or -1. */
int64_t kg_tokenizer_json_token_to_id(const kg_tokenizer_json *t, const char *s, size_t n);
/* The token of id (*n bytes), or NULL when out of range. */
const char *kg_tokenizer_json_id_to_token(const kg_tokenizer_json *t, int64_t id, size_t *n);
/* Whether id is a special added token. */
bool kg_tokenizer_json_is_special(const kg_tokenizer_json *t, int64_t id);
/* "BPE", "WordPiece", "Unigram" or "WordLevel". */
const char *kg_tokenizer_json_model_type(const kg_tokenizer_json *t);

#ifdef __cplusplus
}
#endif

#endif
