/* io.h — checkpoints: reading and writing safetensors files (engine/io/safetensors.c).
 *
 * A kg_tensor_dict is an ordered list of named tensors plus string metadata. Loading
 * validates every rule of the safetensors format (docs/checkpoints.md) and memory-maps the
 * file: loaded tensors share one private (copy-on-write) mapping, unmapped when the last of
 * them is released; a tensor whose bytes are misaligned for its dtype is copied instead.
 * Saving is atomic: a temp file in the same directory, fsync, rename, fsync of the directory.
 * Errors are KG_ERR_IO with messages "load: <path>: ..." / "save: <path>: ...".
 * Included at the end of keng.h. */
#ifndef KENG_IO_H
#define KENG_IO_H

typedef struct {
  int n;               /* tensors */
  char **names;        /* [n] owned copies */
  kg_tensor **tensors; /* [n] owned references */
  int nmeta;           /* metadata entries */
  char **meta_keys;    /* [nmeta] owned copies */
  char **meta_values;  /* [nmeta] owned copies */
} kg_tensor_dict;

/* Appends name -> t (t retained, name copied). */
kg_status kg_tensor_dict_add(kg_tensor_dict *d, const char *name, kg_tensor *t);
kg_status kg_tensor_dict_add_meta(kg_tensor_dict *d, const char *key, const char *value);
/* Releases every tensor and string; leaves *d empty (safe on a zeroed dict). */
void kg_tensor_dict_free(kg_tensor_dict *d);

/* [out] d: the tensors of `path`: a .safetensors file, a model.safetensors.index.json (every
 * shard loaded and merged), or a directory holding model.safetensors or that index. Pickle
 * checkpoints (.bin/.pt/.pth/.ckpt, or pickle/zip content) are refused. On failure *d is empty. */
kg_status kg_safetensors_load(kg_tensor_dict *d, const char *path);
/* [out] d: parses a whole safetensors file held in memory (tensors are copied out of bytes);
 * `label` names it in error messages. The same validation as kg_safetensors_load. */
kg_status kg_safetensors_parse(kg_tensor_dict *d, const void *bytes, size_t len, const char *label);
/* Writes d to path atomically (tensors of any device, dtype and layout). The environment
 * variable KENG_IO_FAIL_AFTER_BYTES=N makes the write fail after N bytes (for tests). */
kg_status kg_safetensors_save(const char *path, const kg_tensor_dict *d);
/* Whether path, a file a loader opens by name in the model directory dir, resolves (symlinks
 * followed) outside it: outside dir itself, or for a Hugging Face cache snapshot
 * (<repo>/snapshots/<rev>/, or a subfolder of it) outside <repo>/ — the rule the shards of an
 * index follow. true sets *real and *root (malloc'd; the caller frees them); false (inside, or
 * either path unresolvable, e.g. missing) leaves them NULL. */
bool kg_path_escapes(const char *dir, const char *path, char **real, char **root);

#endif
