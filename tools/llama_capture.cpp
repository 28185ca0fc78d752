// llama_capture.cpp - run a GGUF with llama.cpp on given token ids (one batch) and write the graph
// tensors whose names match a regex, as a raw port capture for zaya_compare/portmap.py:
//   OUT/<name>.npy   float32 or int32, C order, shape = ggml's ne reversed (ne[0], the fastest, last)
//   OUT/index.json   ids, the GGUF, the port's commit, the settings, every tensor's ggml ne/type/op
//
//   llama_capture MODEL.gguf --ids 2,818,2255 --out DIR [--re REGEX] [--commit SHA] [--threads N]
//                 [--kv f32|f16] [--fa off|on] [--logits]
//
// --re is an ECMAScript regex searched in each graph tensor's name (`zaya_compare.portmap MAP --regex`
// prints the one a map needs; default: every named tensor). Defaults: f32 KV cache, flash attention off,
// so that what differs from the reference is the port's graph, not these run-time options. --logits also
// writes logits.npy ([T, n_vocab]) from llama_get_logits_ith. Not part of `make`: it links llama.cpp.
// Build (docs/compare.md §9; LLAMA = a built llama.cpp checkout):
//   g++ -O2 -std=c++17 -I$LLAMA/include -I$LLAMA/ggml/include -o build/llama_capture tools/llama_capture.cpp
//       -L$LLAMA/build/bin -lllama -lggml -lggml-base -Wl,-rpath,$LLAMA/build/bin       (one line)
// or `make capture LLAMA=$LLAMA`.
#include "ggml.h"
#include "ggml-backend.h"
#include "llama.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <regex>
#include <string>
#include <sys/stat.h>
#include <vector>

static void die(const std::string &what, const std::string &hint) {
    fprintf(stderr, "llama_capture: %s\n  hint: %s\n", what.c_str(), hint.c_str());
    exit(2);
}

static std::string json_str(const std::string &s) {
    std::string o = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') { o += '\\'; o += (char)c; }
        else if (c < 0x20) { char b[8]; snprintf(b, sizeof b, "\\u%04x", c); o += b; }
        else o += (char)c;
    }
    return o + "\"";
}

// NumPy format 1.0: header padded so that the data starts at a multiple of 64 bytes.
static void write_npy(const std::string &path, const char *descr, const void *data, size_t elem, const std::vector<long> &shape) {
    std::string s = "(";
    size_t n = 1;
    for (size_t i = 0; i < shape.size(); i++) {
        s += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? ", " : "");
        n *= (size_t)shape[i];
    }
    s += ")";
    std::string h = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + s + ", }";
    h += std::string((64 - (10 + h.size() + 1) % 64) % 64, ' ') + "\n";
    unsigned short hl = (unsigned short)h.size();
    FILE *f = fopen(path.c_str(), "wb");
    if (!f) die("cannot write " + path + ": " + strerror(errno), "is --out a writable folder?");
    bool ok = fwrite("\x93NUMPY\x01\x00", 1, 8, f) == 8 && fwrite(&hl, 2, 1, f) == 1 &&
              fwrite(h.data(), 1, h.size(), f) == h.size() && fwrite(data, elem, n, f) == n;
    if (fclose(f) != 0 || !ok) die("cannot write " + path, "is the disk full?");
}

struct Capture {
    std::regex re;
    std::string dir;
    std::vector<std::string> order;                 // tensor names in the order the graph computed them
    std::map<std::string, std::string> entry;       // name -> index.json entry
    std::vector<std::string> skipped;               // matched, but neither f32 nor i32
};

static bool eval_cb(struct ggml_tensor *t, bool ask, void *ud) {
    Capture *c = (Capture *)ud;
    if (!t->name[0] || !std::regex_search(t->name, c->re)) return !ask ? true : false;
    if (ask) return true;
    const bool f32 = t->type == GGML_TYPE_F32, i32 = t->type == GGML_TYPE_I32;
    if (!f32 && !i32) { c->skipped.push_back(std::string(t->name) + " (" + ggml_type_name(t->type) + ")"); return true; }
    const size_t n = (size_t)ggml_nelements(t);
    if (n == 0) { c->skipped.push_back(std::string(t->name) + " (empty)"); return true; }
    std::vector<char> buf(n * 4);
    if (ggml_is_contiguous(t)) {
        ggml_backend_tensor_get(t, buf.data(), 0, n * 4);
    } else {   // a strided view: gather element by element in ne order
        size_t k = 0;
        for (int64_t i3 = 0; i3 < t->ne[3]; i3++) for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
        for (int64_t i1 = 0; i1 < t->ne[1]; i1++) for (int64_t i0 = 0; i0 < t->ne[0]; i0++, k++)
            ggml_backend_tensor_get(t, buf.data() + 4 * k, i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3], 4);
    }
    std::vector<long> shape;
    for (int i = ggml_n_dims(t) - 1; i >= 0; i--) shape.push_back((long)t->ne[i]);
    std::string file = std::string(t->name) + ".npy";
    for (char &ch : file) if (ch == '/' || ch == ':') ch = '~';
    write_npy(c->dir + "/" + file, f32 ? "<f4" : "<i4", buf.data(), 4, shape);
    std::string e = "{\"name\": " + json_str(t->name) + ", \"file\": " + json_str(file) + ", \"shape\": [";
    for (size_t i = 0; i < shape.size(); i++) e += (i ? ", " : "") + std::to_string(shape[i]);
    e += "], \"dtype\": \"" + std::string(f32 ? "float32" : "int32") + "\", \"ggml_ne\": [";
    for (int i = 0; i < 4; i++) e += (i ? ", " : "") + std::to_string(t->ne[i]);
    e += "], \"ggml_op\": " + json_str(ggml_op_desc(t)) + "}";
    if (!c->entry.count(t->name)) c->order.push_back(t->name);
    c->entry[t->name] = e;   // a name computed twice keeps its last value
    return true;
}

static std::string meta(const llama_model *m, const std::string &key) {
    char buf[256];
    return llama_model_meta_val_str(m, key.c_str(), buf, sizeof buf) >= 0 ? std::string(buf) : std::string();
}

int main(int argc, char **argv) {
    const char *usage = "usage: llama_capture MODEL.gguf --ids 2,818,2255 --out DIR [--re REGEX] [--commit SHA] [--threads N] "
                        "[--kv f32|f16] [--fa off|on] [--logits]";
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) { fprintf(stderr, "%s\n", usage); return argc < 2 ? 2 : 0; }
    std::string model_path = argv[1], ids_arg, out, re = ".", commit = "unknown", kv = "f32", fa = "off";
    int threads = 2;
    bool want_logits = false;
    for (int i = 2; i < argc; i++) {
        std::string a = argv[i];
        auto val = [&]() -> std::string { if (i + 1 >= argc) die(a + " needs a value", usage); return argv[++i]; };
        if (a == "--ids") ids_arg = val();
        else if (a == "--out") out = val();
        else if (a == "--re") re = val();
        else if (a == "--commit") commit = val();
        else if (a == "--threads") threads = atoi(val().c_str());
        else if (a == "--kv") kv = val();
        else if (a == "--fa") fa = val();
        else if (a == "--logits") want_logits = true;
        else die("unknown argument " + a, usage);
    }
    if (ids_arg.empty() || out.empty()) die("--ids and --out are required", usage);
    if (kv != "f32" && kv != "f16") die("--kv " + kv + ": expected f32 or f16", usage);
    if (fa != "off" && fa != "on") die("--fa " + fa + ": expected off or on", usage);
    std::vector<llama_token> ids;
    for (const char *s = ids_arg.c_str(); *s;) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0) die("--ids " + ids_arg + ": expected comma-separated non-negative integers", "e.g. --ids 2,818,2255");
        ids.push_back((llama_token)v);
        s = end + (*end == ',');
    }
    Capture cap;
    try { cap.re = std::regex(re); } catch (const std::regex_error &e) { die("--re " + re + ": not a regex: " + e.what(), "an ECMAScript regex"); }
    cap.dir = out;
    if (mkdir(out.c_str(), 0755) != 0 && errno != EEXIST) die("cannot create " + out + ": " + strerror(errno), "a writable path");
    std::string old_index = out + "/index.json";
    remove(old_index.c_str());   // index.json is written last: a folder without it is an unfinished capture

    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    llama_model *model = llama_model_load_from_file(model_path.c_str(), mp);
    if (!model) die("cannot load " + model_path, "a GGUF written by the port's convert_hf_to_gguf.py");
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    const int n = (int)ids.size();
    for (llama_token id : ids)
        if (id >= n_vocab) die("id " + std::to_string(id) + " is not in the GGUF's vocabulary of " + std::to_string(n_vocab), "ids < n_vocab");
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n < 64 ? 64 : n);
    cp.n_batch = cp.n_ubatch = (uint32_t)n;   // one ubatch: every graph tensor is computed once, over all positions
    cp.n_threads = cp.n_threads_batch = threads;
    cp.type_k = cp.type_v = kv == "f32" ? GGML_TYPE_F32 : GGML_TYPE_F16;
    cp.flash_attn_type = fa == "on" ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.cb_eval = eval_cb;
    cp.cb_eval_user_data = &cap;
    llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) die("cannot create a llama.cpp context for " + std::to_string(n) + " positions", "fewer ids");
    llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) { b.token[i] = ids[i]; b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = 1; }
    b.n_tokens = n;
    if (llama_decode(ctx, b) != 0) die("llama_decode failed", "see llama.cpp's log above");
    if (want_logits) {
        std::vector<float> all((size_t)n * n_vocab);
        for (int i = 0; i < n; i++) memcpy(&all[(size_t)i * n_vocab], llama_get_logits_ith(ctx, i), sizeof(float) * n_vocab);
        write_npy(out + "/logits.npy", "<f4", all.data(), 4, {(long)n, (long)n_vocab});
    }

    std::string arch = meta(model, "general.architecture");
    FILE *f = fopen((out + "/index.json").c_str(), "w");
    if (!f) die("cannot write " + out + "/index.json", "a writable folder");
    fprintf(f, "{\n  \"format\": \"llama-capture/1\",\n  \"tokens\": [");
    for (int i = 0; i < n; i++) fprintf(f, "%s%d", i ? ", " : "", ids[i]);
    fprintf(f, "],\n  \"model\": {\"path\": %s, \"architecture\": %s, \"file_type\": %s, \"n_layer\": %d, \"n_embd\": %d, "
               "\"n_head\": %d, \"n_head_kv\": %d, \"n_vocab\": %d, \"expert_count\": %s},\n",
            json_str(model_path).c_str(), json_str(arch).c_str(), json_str(meta(model, "general.file_type")).c_str(),
            llama_model_n_layer(model), llama_model_n_embd(model), llama_model_n_head(model), llama_model_n_head_kv(model),
            n_vocab, json_str(meta(model, arch + ".expert_count")).c_str());
    fprintf(f, "  \"producer\": {\"program\": \"llama.cpp\", \"commit\": %s, \"capture\": \"tools/llama_capture.cpp\"},\n",
            json_str(commit).c_str());
    fprintf(f, "  \"run\": {\"kv_type\": \"%s\", \"flash_attn\": \"%s\", \"threads\": %d, \"ubatch\": %d, \"regex\": %s},\n",
            kv.c_str(), fa.c_str(), threads, n, json_str(re).c_str());
    if (want_logits) fprintf(f, "  \"logits\": {\"file\": \"logits.npy\", \"shape\": [%d, %d]},\n", n, n_vocab);
    fprintf(f, "  \"skipped\": [");
    for (size_t i = 0; i < cap.skipped.size(); i++) fprintf(f, "%s%s", i ? ", " : "", json_str(cap.skipped[i]).c_str());
    fprintf(f, "],\n  \"tensors\": [\n");
    for (size_t i = 0; i < cap.order.size(); i++) fprintf(f, "    %s%s\n", cap.entry[cap.order[i]].c_str(), i + 1 < cap.order.size() ? "," : "");
    fprintf(f, "  ]\n}\n");
    if (fclose(f) != 0) die("cannot write " + out + "/index.json", "is the disk full?");
    fprintf(stderr, "llama_capture: %zu tensors (%zu matched but not f32/i32) from %d positions -> %s\n",
            cap.order.size(), cap.skipped.size(), n, out.c_str());
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
