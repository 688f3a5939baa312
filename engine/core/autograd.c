/* autograd.c — the tape: nodes recorded by ops, and kg_backward walking them in reverse.
 *
 * A node keeps detached views of the tensors its backward needs (so no tensor <-> node cycle
 * exists) with their storage version at save time; backward refuses to run if one has been
 * written in place since. Nodes are ordered by a creation counter, which is a topological
 * order: backward visits the reachable nodes from newest to oldest.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local int grad_disabled; /* 0 = grad mode on */
static uint64_t node_counter, visit_counter;

bool kg_grad_enabled(void) { return !grad_disabled; }
bool kg_set_grad_enabled(bool on) {
  bool was = !grad_disabled;
  grad_disabled = !on;
  return was;
}

static kg_tensor_meta meta_of(const kg_tensor *t) {
  kg_tensor_meta m = {t->ndim, {0}, t->dtype, t->device};
  memcpy(m.shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
  return m;
}

static kg_tensor *detached(const kg_tensor *t) {
  kg_tensor *d = NULL;
  kg_tensor_view_raw(&d, t, t->ndim, t->shape, t->stride, t->offset);
  return d;
}

kg_status kg_op_record(kg_op op, int nout, kg_tensor *const *out, int nin, const kg_tensor *const *in,
                       const void *params, size_t params_size) {
  if (grad_disabled || !kg_op_info[op].differentiable) return KG_OK;
  bool any = false;
  for (int i = 0; i < nin; i++)
    if (in[i] && kg_requires_grad(in[i])) any = true;
  if (!any) return KG_OK;
  bool any_float_out = false;
  for (int j = 0; j < nout; j++)
    if (kg_dtype_info[out[j]->dtype].is_float) any_float_out = true;
  if (!any_float_out) return KG_OK;

  kg_node *n = calloc(1, sizeof *n);
  if (!n) return kg_error(KG_ERR_OOM, kg_op_info[op].name, "out of memory recording the autograd node");
  n->op = op;
  n->seq = __atomic_add_fetch(&node_counter, 1, __ATOMIC_RELAXED);
  n->nin = nin;
  n->nout = nout;
  n->next = calloc((size_t)nin + 1, sizeof *n->next);
  n->in_meta = calloc((size_t)nin + 1, sizeof *n->in_meta);
  n->out_meta = calloc((size_t)nout + 1, sizeof *n->out_meta);
  n->saved_in = calloc((size_t)nin + 1, sizeof *n->saved_in);
  n->saved_out = calloc((size_t)nout + 1, sizeof *n->saved_out);
  n->saved_in_version = calloc((size_t)nin + 1, sizeof(uint64_t));
  n->saved_out_version = calloc((size_t)nout + 1, sizeof(uint64_t));
  n->params = params_size ? malloc(params_size) : NULL;
  if (params_size && n->params) memcpy(n->params, params, params_size);
  unsigned saves = kg_op_info[op].saves;
  for (int i = 0; i < nin; i++) {
    if (!in[i]) continue;
    n->in_meta[i] = meta_of(in[i]);
    if (in[i]->grad_fn) {
      n->next[i].fn = in[i]->grad_fn;
      n->next[i].fn->refcount++;
      n->next[i].output_nr = in[i]->output_nr;
    } else if (in[i]->requires_grad) {
      n->next[i].leaf = kg_tensor_retain((kg_tensor *)in[i]);
    }
    if (i < 16 && (saves & KG_SAVES_IN(i))) {
      n->saved_in[i] = detached(in[i]);
      n->saved_in_version[i] = in[i]->storage->version;
    }
  }
  for (int j = 0; j < nout; j++) {
    n->out_meta[j] = meta_of(out[j]);
    if (j < 16 && (saves & KG_SAVES_OUT(j))) {
      n->saved_out[j] = detached(out[j]);
      n->saved_out_version[j] = out[j]->storage->version;
    }
  }
  for (int j = 0; j < nout; j++) {
    if (!kg_dtype_info[out[j]->dtype].is_float) continue;
    if (out[j]->grad_fn) kg_node_release(out[j]->grad_fn);
    out[j]->grad_fn = n;
    out[j]->output_nr = j;
    n->refcount++;
  }
  return KG_OK;
}

static void release_saved(kg_node *n) {
  for (int i = 0; i < n->nin; i++) {
    kg_tensor_release(n->saved_in[i]);
    n->saved_in[i] = NULL;
  }
  for (int j = 0; j < n->nout; j++) {
    kg_tensor_release(n->saved_out[j]);
    n->saved_out[j] = NULL;
  }
}

void kg_node_release(kg_node *root) {
  /* iterative, so releasing a long chain (a 10k-step loop) cannot overflow the C stack */
  size_t cap = 16, top = 0;
  kg_node **stack = malloc(cap * sizeof *stack);
  if (!stack) return;
  stack[top++] = root;
  while (top) {
    kg_node *n = stack[--top];
    if (--n->refcount > 0) continue;
    for (int i = 0; i < n->nin; i++) {
      if (n->next[i].fn) {
        if (top == cap) {
          kg_node **s2 = realloc(stack, (cap *= 2) * sizeof *stack);
          if (!s2) continue; /* leak rather than crash */
          stack = s2;
        }
        stack[top++] = n->next[i].fn;
      }
      kg_tensor_release(n->next[i].leaf);
    }
    release_saved(n);
    if (n->grad_buf) kg_release_all(n->nout, n->grad_buf);
    free(n->grad_buf);
    free(n->next);
    free(n->in_meta);
    free(n->out_meta);
    free(n->saved_in);
    free(n->saved_out);
    free(n->saved_in_version);
    free(n->saved_out_version);
    free(n->params);
    free(n);
  }
  free(stack);
}

kg_status kg_check_inplace(const char *op, const kg_tensor *t) {
  if (!grad_disabled && kg_requires_grad(t))
    return kg_error(KG_ERR_AUTOGRAD, op,
                    "a tensor that requires grad cannot be modified in place; wrap the update in no_grad or "
                    "use an out-of-place op");
  return KG_OK;
}

kg_status kg_sum_to(kg_tensor **out, kg_tensor *g, int ndim, const int64_t *shape, kg_dtype dt) {
  kg_tensor *r = kg_tensor_retain(g), *t;
  bool same = g->ndim == ndim;
  for (int i = 0; same && i < ndim; i++) same = g->shape[i] == shape[i];
  if (!same) {
    uint32_t mask = 0;
    int lead = g->ndim - ndim;
    for (int i = 0; i < g->ndim; i++) {
      if (i < lead || (shape[i - lead] == 1 && g->shape[i] != 1)) mask |= 1u << i;
    }
    kg_status s = mask ? kg_sum(&t, r, mask, true) : kg_contiguous(&t, r);
    kg_tensor_release(r);
    KG_TRY(s);
    s = kg_reshape(&r, t, ndim, shape);
    kg_tensor_release(t);
    KG_TRY(s);
  }
  if (r->dtype != dt) {
    kg_status s = kg_to(&t, r, dt, r->device);
    kg_tensor_release(r);
    KG_TRY(s);
    r = t;
  }
  *out = r;
  return KG_OK;
}

static kg_status check_versions(kg_node *n) {
  const char *name = kg_op_info[n->op].name;
  for (int i = 0; i < n->nin; i++)
    if (n->saved_in[i] && n->saved_in[i]->storage->version != n->saved_in_version[i])
      return kg_error(KG_ERR_AUTOGRAD, name,
                      "input %d, saved for backward, was modified by an in-place operation (version %llu, "
                      "now %llu)",
                      i + 1, (unsigned long long)n->saved_in_version[i],
                      (unsigned long long)n->saved_in[i]->storage->version);
  for (int j = 0; j < n->nout; j++)
    if (n->saved_out[j] && n->saved_out[j]->storage->version != n->saved_out_version[j])
      return kg_error(KG_ERR_AUTOGRAD, name,
                      "output %d, saved for backward, was modified by an in-place operation", j + 1);
  return KG_OK;
}

/* buf <- buf + g (out of place: buf may alias a tensor someone else holds) */
static kg_status accumulate(kg_tensor **buf, kg_tensor *g) {
  if (!*buf) {
    *buf = kg_tensor_retain(g);
    return KG_OK;
  }
  kg_tensor *sum;
  KG_TRY(kg_binary(&sum, KG_OP_ADD, *buf, g));
  if (sum->dtype != (*buf)->dtype) {
    kg_tensor *c;
    kg_status s = kg_to(&c, sum, (*buf)->dtype, sum->device);
    kg_tensor_release(sum);
    KG_TRY(s);
    sum = c;
  }
  kg_tensor_release(*buf);
  *buf = sum;
  return KG_OK;
}

static kg_status accumulate_leaf(kg_tensor *leaf, kg_tensor *g) {
  if (!leaf->grad) return kg_clone(&leaf->grad, g);
  if (!kg_same_shape(leaf->grad, g))
    return kg_error(KG_ERR_SHAPE, "backward", "accumulated grad has a different shape than the new one");
  return kg_binary_(KG_OP_ADD, leaf->grad, g);
}

typedef struct {
  kg_node **v;
  size_t n, cap;
} node_list;

static int push(node_list *l, kg_node *n) {
  if (l->n == l->cap) {
    size_t c = l->cap ? l->cap * 2 : 64;
    kg_node **v = realloc(l->v, c * sizeof *v);
    if (!v) return -1;
    l->v = v;
    l->cap = c;
  }
  l->v[l->n++] = n;
  return 0;
}

static int by_seq_desc(const void *a, const void *b) {
  uint64_t x = (*(kg_node *const *)a)->seq, y = (*(kg_node *const *)b)->seq;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* a leaf's gradient is final once the last node (in backward's order) that feeds it has run */
typedef struct {
  size_t at; /* index in the order after which the leaf is done */
  kg_tensor *leaf;
} leaf_ready;

/* ready <- each leaf input's last node, ascending by `at` (order is newest first) */
static kg_status plan_ready(const node_list *order, leaf_ready **ready, size_t *nready) {
  size_t n = 0, cap = 0;
  leaf_ready *v = NULL;
  for (size_t k = order->n; k-- > 0;) {
    kg_node *node = order->v[k];
    for (int i = 0; i < node->nin; i++) {
      kg_tensor *leaf = node->next[i].leaf;
      if (!leaf) continue;
      bool seen = false; /* leaves are few (parameters): a linear scan is plenty */
      for (size_t j = 0; j < n && !seen; j++) seen = v[j].leaf == leaf;
      if (seen) continue;
      if (n == cap) {
        cap = cap ? cap * 2 : 64;
        leaf_ready *w = realloc(v, cap * sizeof *v);
        if (!w) return free(v), kg_error(KG_ERR_OOM, "backward", "out of memory");
        v = w;
      }
      v[n++] = (leaf_ready){k, leaf};
    }
  }
  for (size_t a = 0, b = n ? n - 1 : 0; a < b; a++, b--) { /* found last-first: reverse */
    leaf_ready t = v[a];
    v[a] = v[b], v[b] = t;
  }
  *ready = v, *nready = n;
  return KG_OK;
}

static kg_status run_node(kg_node *n, bool retain_graph) {
  const kg_op_facts *f = &kg_op_info[n->op];
  bool any = false;
  for (int j = 0; j < n->nout; j++)
    if (n->grad_buf[j]) any = true;
  if (!any) return KG_OK;
  if (n->released)
    return kg_error(KG_ERR_AUTOGRAD, f->name,
                    "trying to backward through the graph a second time (its saved tensors were freed); "
                    "pass retain_graph=true the first time");
  KG_TRY(check_versions(n));
  if (!f->backward) return kg_error(KG_ERR_AUTOGRAD, f->name, "op has no backward");
  kg_tensor *din[64] = {0}, **dinp = n->nin <= 64 ? din : calloc((size_t)n->nin, sizeof *dinp);
  if (!dinp) return kg_error(KG_ERR_OOM, f->name, "out of memory in backward");
  kg_status s = f->backward(n, n->grad_buf, dinp);
  for (int i = 0; s == KG_OK && i < n->nin; i++) {
    if (!dinp[i] || !kg_node_needs_grad(n, i)) continue;
    kg_tensor *g;
    s = kg_sum_to(&g, dinp[i], n->in_meta[i].ndim, n->in_meta[i].shape, n->in_meta[i].dtype);
    if (s) break;
    if (n->next[i].fn) s = accumulate(&n->next[i].fn->grad_buf[n->next[i].output_nr], g);
    else s = accumulate_leaf(n->next[i].leaf, g);
    kg_tensor_release(g);
  }
  for (int i = 0; i < n->nin; i++) kg_tensor_release(dinp[i]);
  if (dinp != din) free(dinp);
  KG_TRY(s);
  kg_release_all(n->nout, n->grad_buf);
  memset(n->grad_buf, 0, sizeof(kg_tensor *) * (size_t)n->nout);
  if (!retain_graph) {
    release_saved(n);
    n->released = true;
  }
  return KG_OK;
}

static kg_status run_backward(node_list *order, bool retain_graph, kg_grad_ready_fn on_ready, void *ud) {
  leaf_ready *ready = NULL;
  size_t nready = 0, next = 0;
  if (on_ready) KG_TRY(plan_ready(order, &ready, &nready));
  kg_status s = KG_OK;
  for (size_t k = 0; k < order->n && s == KG_OK; k++) {
    s = run_node(order->v[k], retain_graph);
    for (; s == KG_OK && next < nready && ready[next].at == k; next++) s = on_ready(ready[next].leaf, ud);
  }
  free(ready);
  return s;
}

kg_status kg_backward_ex(kg_tensor *root, const kg_tensor *grad, bool retain_graph, kg_grad_ready_fn on_ready,
                         void *ud) {
  char b1[KG_SHAPE_STR_MAX], b2[KG_SHAPE_STR_MAX];
  if (!kg_requires_grad(root))
    return kg_error(KG_ERR_AUTOGRAD, "backward", "the tensor does not require grad and has no grad_fn");
  kg_tensor *g;
  if (grad) {
    if (!kg_same_shape(grad, root))
      return kg_error(KG_ERR_SHAPE, "backward", "grad %s does not match the tensor %s", KG_SHAPE(grad, b1),
                      KG_SHAPE(root, b2));
    g = kg_tensor_retain((kg_tensor *)grad);
  } else {
    if (kg_numel(root) != 1)
      return kg_error(KG_ERR_SHAPE, "backward",
                      "grad can be implied only for a one-element tensor, got %s; pass a gradient",
                      KG_SHAPE(root, b1));
    KG_TRY(kg_full(&g, root->ndim, root->shape, 1.0, root->dtype, root->device));
  }
  bool was = kg_set_grad_enabled(false);
  kg_status s = KG_OK;
  if (!root->grad_fn) { /* a leaf */
    s = accumulate_leaf(root, g);
    if (s == KG_OK && on_ready) s = on_ready(root, ud);
    kg_tensor_release(g);
    kg_set_grad_enabled(was);
    return s;
  }
  /* collect reachable nodes */
  uint64_t epoch = __atomic_add_fetch(&visit_counter, 1, __ATOMIC_RELAXED);
  node_list order = {0}, stack = {0};
  if (push(&stack, root->grad_fn)) s = kg_error(KG_ERR_OOM, "backward", "out of memory");
  root->grad_fn->visit = epoch;
  while (s == KG_OK && stack.n) {
    kg_node *n = stack.v[--stack.n];
    if (push(&order, n)) s = kg_error(KG_ERR_OOM, "backward", "out of memory");
    if (!n->grad_buf) n->grad_buf = calloc((size_t)n->nout, sizeof(kg_tensor *));
    for (int i = 0; i < n->nin; i++) {
      kg_node *m = n->next[i].fn;
      if (m && m->visit != epoch) {
        m->visit = epoch;
        if (push(&stack, m)) s = kg_error(KG_ERR_OOM, "backward", "out of memory");
      }
    }
  }
  if (s == KG_OK) {
    qsort(order.v, order.n, sizeof *order.v, by_seq_desc);
    s = accumulate(&root->grad_fn->grad_buf[root->output_nr], g);
    if (s == KG_OK) s = run_backward(&order, retain_graph, on_ready, ud);
  }
  for (size_t k = 0; k < order.n; k++) { /* on failure, drop partial gradients */
    kg_node *n = order.v[k];
    if (n->grad_buf) {
      kg_release_all(n->nout, n->grad_buf);
      memset(n->grad_buf, 0, sizeof(kg_tensor *) * (size_t)n->nout);
    }
  }
  free(order.v);
  free(stack.v);
  kg_tensor_release(g);
  kg_set_grad_enabled(was);
  return s;
}

kg_status kg_backward(kg_tensor *root, const kg_tensor *grad, bool retain_graph) {
  return kg_backward_ex(root, grad, retain_graph, NULL, NULL);
}
