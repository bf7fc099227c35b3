/*
 * Records as JSON text, straight from their CBOR bytes: the fast path of the rule in
 * docs/JSON.md, for readers that want text and never the values (the Spark replay,
 * `persistlog dump --json`).
 *
 * It handles the common subset of CBOR -- integers of up to 64 bits, floats, text and
 * byte strings, definite-length arrays and maps keyed by distinct text strings, false,
 * true, null and undefined -- and writes exactly what persistlog._format.jsonify.to_json writes
 * for the value cbor2 decodes. Anything else (a tag, a map with another kind of key or a
 * repeated key, an indefinite length, a simple value, invalid UTF-8, deep nesting,
 * damaged or trailing bytes) makes the whole call return None, and the caller takes the
 * Python path, which decides what the bytes mean and raises on damage. So this file never
 * judges corruption, and never has to agree with cbor2 on anything but the happy path.
 *
 * Every length read from the input is checked against the bytes left before it is used;
 * nothing is allocated from a length the input declares. The output grows as it is
 * written.
 *
 * The module also holds the writer's C paths: the nesting depth of a value before it is
 * encoded, and Staging, the batch buffer's append in one call (at the end of the file).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 256
/* Repeated keys are looked for pair by pair: bigger maps are left to Python's dict, so
 * that hostile bytes cannot make this quadratic search long. */
#define MAX_MAP_KEYS 64

enum { OK = 0, FALLBACK = 1, NOMEM = 2 };

typedef struct {
    char *buf;
    Py_ssize_t len;
    Py_ssize_t cap;
} Out;

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
} In;

static int
out_reserve(Out *o, Py_ssize_t extra)
{
    if (o->len + extra <= o->cap)
        return OK;
    Py_ssize_t cap = o->cap ? o->cap : 256;
    while (cap < o->len + extra) {
        if (cap > PY_SSIZE_T_MAX / 2)
            return NOMEM;
        cap *= 2;
    }
    char *buf = PyMem_Realloc(o->buf, (size_t)cap);
    if (buf == NULL)
        return NOMEM;
    o->buf = buf;
    o->cap = cap;
    return OK;
}

static int
out_put(Out *o, const char *s, Py_ssize_t n)
{
    if (out_reserve(o, n) != OK)
        return NOMEM;
    memcpy(o->buf + o->len, s, (size_t)n);
    o->len += n;
    return OK;
}

#define PUT_LIT(o, s) out_put((o), (s), (Py_ssize_t)(sizeof(s) - 1))

static int
out_uint(Out *o, uint64_t v)
{
    char tmp[24];
    int i = (int)sizeof(tmp);
    do {
        tmp[--i] = (char)('0' + (v % 10));
        v /= 10;
    } while (v);
    return out_put(o, tmp + i, (Py_ssize_t)sizeof(tmp) - i);
}

/* The initial byte and its argument. Indefinite lengths and reserved values are not
 * handled here. */
static int
read_head(In *in, int *major, uint64_t *arg, int *info)
{
    if (in->p >= in->end)
        return FALLBACK;
    unsigned char ib = *in->p++;
    *major = ib >> 5;
    *info = ib & 0x1f;
    int ai = *info;
    if (ai < 24) {
        *arg = (uint64_t)ai;
        return OK;
    }
    int n;
    switch (ai) {
    case 24: n = 1; break;
    case 25: n = 2; break;
    case 26: n = 4; break;
    case 27: n = 8; break;
    default: return FALLBACK; /* 28-30 reserved, 31 indefinite or break */
    }
    if (in->end - in->p < n)
        return FALLBACK;
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | in->p[i];
    in->p += n;
    *arg = v;
    return OK;
}

/* Length of a valid UTF-8 sequence starting at s (at most n bytes), or 0. Rejects
 * overlong forms, surrogates and code points past U+10FFFF, as a strict decoder does. */
static int
utf8_seq(const unsigned char *s, Py_ssize_t n)
{
    unsigned char c = s[0];
    if (c < 0xC2)
        return 0;
    if (c < 0xE0) {
        if (n < 2 || (s[1] & 0xC0) != 0x80)
            return 0;
        return 2;
    }
    if (c < 0xF0) {
        if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80)
            return 0;
        if (c == 0xE0 && s[1] < 0xA0)
            return 0; /* overlong */
        if (c == 0xED && s[1] >= 0xA0)
            return 0; /* surrogate */
        return 3;
    }
    if (c < 0xF5) {
        if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
            return 0;
        if (c == 0xF0 && s[1] < 0x90)
            return 0; /* overlong */
        if (c == 0xF4 && s[1] >= 0x90)
            return 0; /* past U+10FFFF */
        return 4;
    }
    return 0;
}

static const char HEX[] = "0123456789abcdef";

/* A JSON string as Python's json module writes it with ensure_ascii=False: only '"',
 * '\\' and control characters are escaped. */
static int
out_text(Out *o, const unsigned char *s, Py_ssize_t n)
{
    if (out_reserve(o, n + 2) != OK)
        return NOMEM;
    o->buf[o->len++] = '"';
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c >= 0x80) {
            int k = utf8_seq(s + i, n - i);
            if (k == 0)
                return FALLBACK;
            if (out_put(o, (const char *)s + i, k) != OK)
                return NOMEM;
            i += k;
            continue;
        }
        if (c >= 0x20 && c != '"' && c != '\\') {
            /* A run of plain ASCII in one copy. */
            Py_ssize_t j = i + 1;
            while (j < n && s[j] >= 0x20 && s[j] < 0x80 && s[j] != '"' && s[j] != '\\')
                j++;
            if (out_put(o, (const char *)s + i, j - i) != OK)
                return NOMEM;
            i = j;
            continue;
        }
        char esc[6] = {'\\', 0, 0, 0, 0, 0};
        int m = 2;
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        default:
            esc[1] = 'u';
            esc[2] = '0';
            esc[3] = '0';
            esc[4] = HEX[c >> 4];
            esc[5] = HEX[c & 0xf];
            m = 6;
        }
        if (out_put(o, esc, m) != OK)
            return NOMEM;
        i++;
    }
    if (out_reserve(o, 1) != OK)
        return NOMEM;
    o->buf[o->len++] = '"';
    return OK;
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int
out_bytes(Out *o, const unsigned char *s, Py_ssize_t n)
{
    if (PUT_LIT(o, "{\"$bytes\":\"") != OK)
        return NOMEM;
    if (out_reserve(o, (n + 2) / 3 * 4 + 2) != OK)
        return NOMEM;
    char *w = o->buf + o->len;
    Py_ssize_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = ((uint32_t)s[i] << 16) | ((uint32_t)s[i + 1] << 8) | s[i + 2];
        *w++ = B64[(v >> 18) & 63];
        *w++ = B64[(v >> 12) & 63];
        *w++ = B64[(v >> 6) & 63];
        *w++ = B64[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)s[i] << 16;
        *w++ = B64[(v >> 18) & 63];
        *w++ = B64[(v >> 12) & 63];
        *w++ = '=';
        *w++ = '=';
    } else if (n - i == 2) {
        uint32_t v = ((uint32_t)s[i] << 16) | ((uint32_t)s[i + 1] << 8);
        *w++ = B64[(v >> 18) & 63];
        *w++ = B64[(v >> 12) & 63];
        *w++ = B64[(v >> 6) & 63];
        *w++ = '=';
    }
    *w++ = '"';
    *w++ = '}';
    o->len = w - o->buf;
    return OK;
}

static double
half_to_double(uint16_t h)
{
    int exp = (h >> 10) & 0x1f;
    int mant = h & 0x3ff;
    double v;
    if (exp == 0)
        v = ldexp((double)mant, -24);
    else if (exp != 31)
        v = ldexp((double)(mant + 1024), exp - 25);
    else
        v = mant == 0 ? INFINITY : NAN;
    return (h & 0x8000) ? -v : v;
}

static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15};

/* The shortest decimal that reads back as d, for the many floats that have one of at most
 * 15 digits in plain notation (prices, ratios, measurements): d = m / 10**p with m an
 * integer below 10**15, not ending in 0 unless p is 0. Such a decimal is the one repr()
 * picks: it reads back as d (m and 10**p are exact doubles, and IEEE division rounds
 * correctly), and no other decimal of as few digits or fewer does, since any other
 * differs from it by 10**-p at least, more than d's precision at 15 digits. 0 if d has
 * none. */
static int
out_short_float(Out *o, double d)
{
    double a = d < 0 ? -d : d;
    if (!(a >= 1e-4 && a < 1e15))
        return 0; /* repr() writes an exponent, or zero: the general path */
    for (int p = 0; p < 16; p++) {
        double m = a * POW10[p];
        if (m >= 1e15)
            return 0;
        if (m != floor(m) || m / POW10[p] != a)
            continue;
        /* A multiplication that rounded may have missed a smaller p: m then ends in
         * zeros, which are dropped. */
        uint64_t v = (uint64_t)m;
        while (p > 0 && v % 10 == 0) {
            v /= 10;
            p--;
        }
        char tmp[40];
        char digits[24];
        int nd = 0;
        do {
            digits[nd++] = (char)('0' + (v % 10));
            v /= 10;
        } while (v);
        int w = 0;
        if (d < 0)
            tmp[w++] = '-';
        if (nd <= p) { /* 0.000ddd */
            tmp[w++] = '0';
            tmp[w++] = '.';
            for (int z = 0; z < p - nd; z++)
                tmp[w++] = '0';
            while (nd)
                tmp[w++] = digits[--nd];
        } else {
            while (nd > p)
                tmp[w++] = digits[--nd];
            tmp[w++] = '.';
            if (p == 0)
                tmp[w++] = '0';
            while (nd)
                tmp[w++] = digits[--nd];
        }
        return out_put(o, tmp, w) == OK ? 1 : -1;
    }
    return 0;
}

/* A float as Python's float.__repr__ writes it (what json writes), or a $float marker. */
static int
out_float(Out *o, double d)
{
    if (isnan(d))
        return PUT_LIT(o, "{\"$float\":\"NaN\"}");
    if (isinf(d))
        return d > 0 ? PUT_LIT(o, "{\"$float\":\"Infinity\"}") : PUT_LIT(o, "{\"$float\":\"-Infinity\"}");
    int quick = out_short_float(o, d);
    if (quick)
        return quick > 0 ? OK : NOMEM;
    char *s = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (s == NULL)
        return NOMEM;
    int rc = out_put(o, s, (Py_ssize_t)strlen(s));
    PyMem_Free(s);
    return rc;
}

typedef struct {
    const unsigned char *s;
    Py_ssize_t n;
} Key;

/* Where, in the output, the values of a record's "op", "key" and "value" entries are
 * (the ResourceStore convention); -1 where the record has no such entry. */
enum { SPAN_OP, SPAN_KEY, SPAN_VALUE, SPANS };

typedef struct {
    Py_ssize_t start[SPANS];
    Py_ssize_t end[SPANS];
    /* The key's own UTF-8 bytes (in the input) when it is a text string, else NULL. */
    const unsigned char *key_text;
    Py_ssize_t key_len;
} Spans;

static int
span_of(const unsigned char *s, Py_ssize_t n)
{
    if (n == 2 && memcmp(s, "op", 2) == 0)
        return SPAN_OP;
    if (n == 3 && memcmp(s, "key", 3) == 0)
        return SPAN_KEY;
    if (n == 5 && memcmp(s, "value", 5) == 0)
        return SPAN_VALUE;
    return -1;
}

static int item(In *in, Out *o, int depth, Spans *spans);

/* A map's entries; ``spans`` (top-level maps only) learns where op/key/value went. */
static int
map_body(In *in, Out *o, uint64_t pairs, int depth, Spans *spans)
{
    if (pairs > MAX_MAP_KEYS || (uint64_t)(in->end - in->p) < 2 * pairs)
        return FALLBACK;
    Key small[8];
    Key *keys = small; /* 16 bytes a key: kept small, since maps nest */
    if (pairs > 8) {
        keys = PyMem_Malloc(sizeof(Key) * (size_t)pairs);
        if (keys == NULL)
            return NOMEM;
    }
    int rc = OK;
    int escape = 0;
    for (uint64_t k = 0; k < pairs; k++) {
        int major, info;
        uint64_t len;
        if ((rc = read_head(in, &major, &len, &info)) != OK)
            break;
        if (major != 3 || len > (uint64_t)(in->end - in->p)) {
            rc = FALLBACK; /* a key that is not text: the $map form, left to Python */
            break;
        }
        const unsigned char *s = in->p;
        Py_ssize_t n = (Py_ssize_t)len;
        in->p += n;
        for (uint64_t j = 0; j < k; j++) {
            if (keys[j].n == n && memcmp(keys[j].s, s, (size_t)n) == 0) {
                rc = FALLBACK; /* a repeated key: a dict keeps one */
                break;
            }
        }
        if (rc != OK)
            break;
        keys[k].s = s;
        keys[k].n = n;
        if (k == 0) {
            escape = pairs == 1 && n > 0 && s[0] == '$';
            if ((rc = escape ? PUT_LIT(o, "{\"$escape\":{") : PUT_LIT(o, "{")) != OK)
                break;
        } else if ((rc = PUT_LIT(o, ",")) != OK) {
            break;
        }
        if ((rc = out_text(o, s, n)) != OK || (rc = PUT_LIT(o, ":")) != OK)
            break;
        int which = spans != NULL && !escape ? span_of(s, n) : -1;
        if (which >= 0)
            spans->start[which] = o->len;
        const unsigned char *value_at = in->p;
        if ((rc = item(in, o, depth + 1, NULL)) != OK)
            break;
        if (which >= 0)
            spans->end[which] = o->len;
        if (which == SPAN_KEY) {
            /* A definite-length text key (item() checked its UTF-8): its bytes are the
             * item's last ones, after a head of 1, 2, 3, 5 or 9 bytes. */
            int info = value_at[0] & 0x1f;
            int text = (value_at[0] >> 5) == 3 && info < 28;
            Py_ssize_t head = info < 24 ? 1 : (Py_ssize_t)1 + ((Py_ssize_t)1 << (info - 24));
            spans->key_text = text ? value_at + head : NULL;
            spans->key_len = text ? (Py_ssize_t)(in->p - value_at - head) : 0;
        }
    }
    if (keys != small)
        PyMem_Free(keys);
    if (rc != OK)
        return rc;
    if (pairs == 0)
        return PUT_LIT(o, "{}");
    return escape ? PUT_LIT(o, "}}") : PUT_LIT(o, "}");
}

/* One item. ``spans`` is for a record itself (depth 0), NULL below. */
static int
item(In *in, Out *o, int depth, Spans *spans)
{
    if (depth > MAX_DEPTH)
        return FALLBACK;
    int major, info;
    uint64_t arg;
    int rc = read_head(in, &major, &arg, &info);
    if (rc != OK)
        return rc;
    switch (major) {
    case 0:
        return out_uint(o, arg);
    case 1:
        /* -1 - arg, down to -2**64 */
        if (PUT_LIT(o, "-") != OK)
            return NOMEM;
        if (arg == UINT64_MAX)
            return PUT_LIT(o, "18446744073709551616");
        return out_uint(o, arg + 1);
    case 2:
        if (arg > (uint64_t)(in->end - in->p))
            return FALLBACK;
        in->p += arg;
        return out_bytes(o, in->p - arg, (Py_ssize_t)arg);
    case 3:
        if (arg > (uint64_t)(in->end - in->p))
            return FALLBACK;
        in->p += arg;
        return out_text(o, in->p - arg, (Py_ssize_t)arg);
    case 4:
        if (arg > (uint64_t)(in->end - in->p))
            return FALLBACK; /* each item takes a byte at least */
        if (PUT_LIT(o, "[") != OK)
            return NOMEM;
        for (uint64_t i = 0; i < arg; i++) {
            if (i && PUT_LIT(o, ",") != OK)
                return NOMEM;
            if ((rc = item(in, o, depth + 1, NULL)) != OK)
                return rc;
        }
        return PUT_LIT(o, "]");
    case 5:
        return map_body(in, o, arg, depth, spans);
    case 6:
        return FALLBACK; /* tags carry meaning: the Python path gives it */
    default:
        switch (info) {
        case 20: return PUT_LIT(o, "false");
        case 21: return PUT_LIT(o, "true");
        case 22: return PUT_LIT(o, "null");
        case 23: return PUT_LIT(o, "{\"$undefined\":true}");
        case 25: return out_float(o, half_to_double((uint16_t)arg));
        case 26: {
            uint32_t bits = (uint32_t)arg;
            float f;
            memcpy(&f, &bits, sizeof f);
            return out_float(o, (double)f);
        }
        case 27: {
            double d;
            memcpy(&d, &arg, sizeof d);
            return out_float(o, d);
        }
        default:
            return FALLBACK; /* other simple values */
        }
    }
}

/* A column of texts: the texts end to end, count + 1 offsets, and which are not null. */
typedef struct {
    Out text;
    int32_t *offsets;
    unsigned char *valid;
} Column;

static int
column_init(Column *c, Py_ssize_t count, Py_ssize_t reserve, int nullable)
{
    c->text.buf = NULL;
    c->text.len = c->text.cap = 0;
    c->offsets = PyMem_Malloc(sizeof(int32_t) * (size_t)(count + 1));
    c->valid = nullable ? PyMem_Calloc((size_t)(count + 7) / 8 + 1, 1) : NULL;
    if (c->offsets == NULL || (nullable && c->valid == NULL) || out_reserve(&c->text, reserve) != OK)
        return NOMEM;
    c->offsets[0] = 0;
    return OK;
}

static void
column_free(Column *c)
{
    PyMem_Free(c->text.buf);
    PyMem_Free(c->offsets);
    PyMem_Free(c->valid);
}

/* Close row i: a value (valid) or a null. */
static int
column_row(Column *c, Py_ssize_t i, int valid)
{
    if (c->text.len > INT32_MAX)
        return FALLBACK;
    c->offsets[i + 1] = (int32_t)c->text.len;
    if (valid)
        c->valid[i >> 3] |= (unsigned char)(1 << (i & 7));
    return OK;
}

static PyObject *
column_result(Column *c, Py_ssize_t count)
{
#if PY_BIG_ENDIAN
    /* Arrow's offsets are little-endian. */
    for (Py_ssize_t i = 0; i <= count; i++) {
        uint32_t v = (uint32_t)c->offsets[i];
        c->offsets[i] = (int32_t)(((v & 0xff) << 24) | ((v & 0xff00) << 8) | ((v >> 8) & 0xff00) | (v >> 24));
    }
#endif
    if (c->valid == NULL)
        return Py_BuildValue("(y#y#)", c->text.buf, c->text.len, (const char *)c->offsets,
                             (Py_ssize_t)(sizeof(int32_t) * (size_t)(count + 1)));
    return Py_BuildValue("(y#y#y#)", c->text.buf, c->text.len, (const char *)c->offsets,
                         (Py_ssize_t)(sizeof(int32_t) * (size_t)(count + 1)), (const char *)c->valid,
                         (Py_ssize_t)((count + 7) / 8));
}

/* The op, key, key_json and value of one record, read as ResourceStore replays it: a put
 * has a key and a value, a del a key (a missing one is null, as dict.get gives); anything
 * else has none of them. ``key`` is a text key itself, any other key's JSON text. */
enum { COL_OP, COL_KEY, COL_KEY_JSON, COL_VALUE, RESOURCE_COLS };

static int
resource_row(Column *cols, Py_ssize_t i, const Out *o, const Spans *sp)
{
    Py_ssize_t os = sp->start[SPAN_OP], oe = sp->end[SPAN_OP];
    int put = os >= 0 && oe - os == 5 && memcmp(o->buf + os, "\"put\"", 5) == 0;
    int del = os >= 0 && oe - os == 5 && memcmp(o->buf + os, "\"del\"", 5) == 0;
    int rc;
    if (put || del) {
        if (out_put(&cols[COL_OP].text, put ? "put" : "del", 3) != OK)
            return NOMEM;
        for (int k = COL_KEY_JSON; k <= (put ? COL_VALUE : COL_KEY_JSON); k++) {
            int which = k == COL_KEY_JSON ? SPAN_KEY : SPAN_VALUE;
            if (sp->start[which] >= 0)
                rc = out_put(&cols[k].text, o->buf + sp->start[which], sp->end[which] - sp->start[which]);
            else
                rc = out_put(&cols[k].text, "null", 4);
            if (rc != OK)
                return NOMEM;
        }
        if (sp->key_text != NULL)
            rc = out_put(&cols[COL_KEY].text, (const char *)sp->key_text, sp->key_len);
        else if (sp->start[SPAN_KEY] >= 0)
            rc = out_put(&cols[COL_KEY].text, o->buf + sp->start[SPAN_KEY], sp->end[SPAN_KEY] - sp->start[SPAN_KEY]);
        else
            rc = out_put(&cols[COL_KEY].text, "null", 4);
        if (rc != OK)
            return NOMEM;
    }
    if ((rc = column_row(&cols[COL_OP], i, put || del)) != OK || (rc = column_row(&cols[COL_KEY], i, put || del)) != OK
        || (rc = column_row(&cols[COL_KEY_JSON], i, put || del)) != OK)
        return rc;
    return column_row(&cols[COL_VALUE], i, put);
}

PyDoc_STRVAR(records_doc,
"records(payload, count, resource=False) -> (text, offsets[, op, key, key_json, value]) or None\n\n"
"The JSON text (UTF-8) of each of the ``count`` CBOR items that make up ``payload``,\n"
"end to end in ``text``; ``offsets`` holds count + 1 little-endian int32 offsets into\n"
"it (an Arrow string array's layout). With ``resource``, also the ResourceStore\n"
"convention's op, key, key_json and value columns, each (text, offsets, validity\n"
"bitmap); key is a text key itself, another key's JSON text.\n"
"None if the items are not all of the handled kind, or are not exactly ``count``\n"
"items: take the Python path then.");

static PyObject *
records(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t count;
    int resource = 0;
    if (!PyArg_ParseTuple(args, "y*n|p:records", &view, &count, &resource))
        return NULL;
    PyObject *result = NULL;
    Column cols[1 + RESOURCE_COLS];
    int ncols = resource ? 1 + RESOURCE_COLS : 1;
    for (int k = 0; k < 1 + RESOURCE_COLS; k++) {
        cols[k].text.buf = NULL;
        cols[k].offsets = NULL;
        cols[k].valid = NULL;
    }
    In in = {(const unsigned char *)view.buf, (const unsigned char *)view.buf + view.len};
    int rc = OK;
    if (count < 0 || count > view.len) {
        rc = FALLBACK;
        goto done;
    }
    for (int k = 0; k < ncols; k++) {
        if ((rc = column_init(&cols[k], count, k == 0 ? view.len * 2 + 64 : view.len + 64, k > 0)) != OK)
            goto done;
    }
    Out *o = &cols[0].text;
    for (Py_ssize_t i = 0; i < count; i++) {
        Spans sp = {{-1, -1, -1}, {-1, -1, -1}, NULL, 0};
        if ((rc = item(&in, o, 0, resource ? &sp : NULL)) != OK)
            goto done;
        if ((rc = column_row(&cols[0], i, 0)) != OK)
            goto done;
        if (resource && (rc = resource_row(cols + 1, i, o, &sp)) != OK)
            goto done;
    }
    if (in.p != in.end) {
        rc = FALLBACK;
        goto done;
    }
    result = PyTuple_New(ncols + 1);
    if (result == NULL) {
        rc = NOMEM;
        goto done;
    }
    PyObject *main = column_result(&cols[0], count);
    if (main == NULL) {
        Py_CLEAR(result);
        goto done;
    }
    PyTuple_SET_ITEM(result, 0, PyTuple_GET_ITEM(main, 0));
    PyTuple_SET_ITEM(result, 1, PyTuple_GET_ITEM(main, 1));
    Py_INCREF(PyTuple_GET_ITEM(main, 0));
    Py_INCREF(PyTuple_GET_ITEM(main, 1));
    Py_DECREF(main);
    for (int k = 1; k < ncols; k++) {
        PyObject *col = column_result(&cols[k], count);
        if (col == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyTuple_SET_ITEM(result, k + 1, col);
    }
done:
    for (int k = 0; k < 1 + RESOURCE_COLS; k++)
        column_free(&cols[k]);
    PyBuffer_Release(&view);
    if (rc == NOMEM)
        return PyErr_NoMemory();
    if (rc == FALLBACK)
        Py_RETURN_NONE;
    return result;
}

/* ---- Nesting depth of a value about to be logged --------------------------------------
 *
 * cbor2's encoder recurses on the C stack once per container and has no guard: a list
 * nested some thousands deep kills the interpreter (SIGSEGV). The writer measures a
 * record first, here, without recursion: an explicit stack of levels, each holding a
 * reference to its container so that a container changed meanwhile (by Python code run
 * from a Mapping or Sequence method) is never read after being freed. It counts what
 * cbor2 recurses into -- lists, tuples, dicts, sets, CBORTag values, and any other
 * Mapping or Sequence -- and stops as soon as the limit is passed, so a cyclic value
 * costs at most ``limit`` levels. Self-contained: nothing above is used.
 */

enum { DEPTH_SEQ, DEPTH_DICT, DEPTH_ITER };

typedef struct {
    PyObject *obj;   /* owned: a list or tuple, a dict, or an iterator */
    PyObject *next;  /* owned: a dict value still to visit after its key, or NULL */
    Py_ssize_t pos;
    int kind;
} DepthLevel;

/* ``out[i] = modules[i].names[i]`` for the n pairs, as new references, all or none: -1
 * with an error set (and every ``out[i]`` left NULL) when one is missing. What this module
 * takes from Python it imports on first use, so that importing it costs nothing. */
static int
import_attributes(int n, const char *const modules[], const char *const names[], PyObject **const out[])
{
    for (int i = 0; i < n; i++) {
        PyObject *module = PyImport_ImportModule(modules[i]);
        *out[i] = module == NULL ? NULL : PyObject_GetAttrString(module, names[i]);
        Py_XDECREF(module);
        if (*out[i] == NULL) {
            for (int j = 0; j < i; j++)
                Py_CLEAR(*out[j]);
            return -1;
        }
    }
    return 0;
}

/* cbor2.CBORTag, collections.abc.Mapping and .Sequence, imported on first use. */
static PyObject *depth_tag_type, *depth_mapping, *depth_sequence;

static int
depth_import_types(void)
{
    static const char *const modules[] = {"cbor2", "collections.abc", "collections.abc"};
    static const char *const names[] = {"CBORTag", "Mapping", "Sequence"};
    PyObject **const out[] = {&depth_tag_type, &depth_mapping, &depth_sequence};
    return depth_sequence != NULL ? 0 : import_attributes(3, modules, names, out);
}

/* Values cbor2 writes without recursing; checked without running any Python code. */
static inline int
depth_is_scalar(PyObject *x)
{
    PyTypeObject *t = Py_TYPE(x);
    return t == &PyUnicode_Type || t == &PyLong_Type || t == &PyFloat_Type || t == &PyBool_Type
        || t == &PyBytes_Type || x == Py_None;
}

/* Whether ``x`` is a container, and if so its level in ``*out`` (owning a new reference).
 * 1: a container, 0: a leaf, -1: an error is set. May run Python code (ABC checks,
 * Mapping and Sequence methods) for types other than the built-in ones. */
static int
depth_open(PyObject *x, DepthLevel *out)
{
    out->next = NULL;
    out->pos = 0;
    if (PyList_Check(x) || PyTuple_Check(x)) {
        Py_INCREF(x);
        out->obj = x;
        out->kind = DEPTH_SEQ;
        return 1;
    }
    if (PyDict_Check(x)) {
        Py_INCREF(x);
        out->obj = x;
        out->kind = DEPTH_DICT;
        return 1;
    }
    if (PyAnySet_Check(x)) {
        if ((out->obj = PyObject_GetIter(x)) == NULL)
            return -1;
        out->kind = DEPTH_ITER;
        return 1;
    }
    if (PyUnicode_Check(x) || PyLong_Check(x) || PyFloat_Check(x) || PyBytes_Check(x)
        || PyByteArray_Check(x))
        return 0;
    if (depth_import_types() < 0)
        return -1;
    int is;
    if ((is = PyObject_IsInstance(x, depth_tag_type)) != 0) {
        if (is < 0)
            return -1;
        PyObject *value = PyObject_GetAttrString(x, "value");
        if (value == NULL)
            return -1;
        out->obj = PyTuple_Pack(1, value);
        Py_DECREF(value);
        out->kind = DEPTH_SEQ;
        return out->obj == NULL ? -1 : 1;
    }
    if ((is = PyObject_IsInstance(x, depth_mapping)) != 0) {
        if (is < 0)
            return -1;
        /* Keys and values, one after the other, in one list. */
        PyObject *items = PyMapping_Items(x);
        if (items == NULL)
            return -1;
        Py_ssize_t n = PyList_GET_SIZE(items);
        PyObject *flat = PyList_New(0);
        for (Py_ssize_t i = 0; flat != NULL && i < n; i++) {
            PyObject *pair = PyList_GET_ITEM(items, i);
            if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
                PyErr_SetString(PyExc_TypeError, "a mapping's items() must be pairs");
                Py_CLEAR(flat);
            } else if (PyList_Append(flat, PyTuple_GET_ITEM(pair, 0)) < 0
                       || PyList_Append(flat, PyTuple_GET_ITEM(pair, 1)) < 0) {
                Py_CLEAR(flat);
            }
        }
        Py_DECREF(items);
        out->obj = flat;
        out->kind = DEPTH_SEQ;
        return flat == NULL ? -1 : 1;
    }
    if ((is = PyObject_IsInstance(x, depth_sequence)) != 0) {
        if (is < 0)
            return -1;
        out->obj = PySequence_Fast(x, "a Sequence that cannot be iterated");
        out->kind = DEPTH_SEQ;
        return out->obj == NULL ? -1 : 1;
    }
    return 0;
}

/* The next child of a level: 1 and a new reference in ``*child``, 0 when there is no
 * more, -1 on an error. */
static int
depth_next_child(DepthLevel *lv, PyObject **child)
{
    switch (lv->kind) {
    case DEPTH_SEQ:
        /* The size is read again each time: Python code may have shrunk a list. */
        if (lv->pos >= PySequence_Fast_GET_SIZE(lv->obj))
            return 0;
        *child = PySequence_Fast_GET_ITEM(lv->obj, lv->pos);
        lv->pos++;
        Py_INCREF(*child);
        return 1;
    case DEPTH_DICT: {
        if (lv->next != NULL) {
            *child = lv->next;
            lv->next = NULL;
            return 1;
        }
        PyObject *k, *v;
        if (!PyDict_Next(lv->obj, &lv->pos, &k, &v))
            return 0;
        if (depth_is_scalar(k)) {
            *child = v;
        } else {
            Py_INCREF(v);
            lv->next = v;
            *child = k;
        }
        Py_INCREF(*child);
        return 1;
    }
    default:
        if ((*child = PyIter_Next(lv->obj)) != NULL)
            return 1;
        return PyErr_Occurred() ? -1 : 0;
    }
}

/* How deep an app's usual record nests, the walk below answering most records. */
#define DEPTH_SHALLOW 8

/* The depth of ``x`` if it is built only of exact dicts, lists and tuples around scalar
 * leaves (dict keys scalars too) and nests at most ``budget`` deep; -2 otherwise, for the
 * general walk to answer. This runs before every update(), so it takes no references and
 * sets up no stack: it runs no Python code (nothing can change what it reads) and
 * recurses at most ``budget`` levels on the C stack. */
static Py_ssize_t
depth_shallow(PyObject *x, int budget)
{
    if (depth_is_scalar(x))
        return 0;
    if (budget == 0)
        return -2;
    PyTypeObject *t = Py_TYPE(x);
    Py_ssize_t deepest = 0, d;
    if (t == &PyDict_Type) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(x, &pos, &k, &v)) {
            if (!depth_is_scalar(k))
                return -2;
            if (!depth_is_scalar(v)) {
                if ((d = depth_shallow(v, budget - 1)) < 0)
                    return -2;
                if (d > deepest)
                    deepest = d;
            }
        }
        return deepest + 1;
    }
    if (t == &PyList_Type || t == &PyTuple_Type) {
        PyObject **items = PySequence_Fast_ITEMS(x);
        Py_ssize_t n = PySequence_Fast_GET_SIZE(x);
        for (Py_ssize_t i = 0; i < n; i++) {
            if (!depth_is_scalar(items[i])) {
                if ((d = depth_shallow(items[i], budget - 1)) < 0)
                    return -2;
                if (d > deepest)
                    deepest = d;
            }
        }
        return deepest + 1;
    }
    return -2;
}

/* The depth of ``value``, ``limit + 1`` once deeper than ``limit``; -1 with an error set. */
static Py_ssize_t
depth_of(PyObject *value, Py_ssize_t limit)
{
    Py_ssize_t shallow = depth_shallow(value, limit < DEPTH_SHALLOW ? (int)limit + 1 : DEPTH_SHALLOW);
    if (shallow >= 0)
        return shallow > limit ? limit + 1 : shallow;
    DepthLevel small[32];
    DepthLevel *stack = small;
    Py_ssize_t cap = 32, height = 0, deepest = 0;
    PyObject *child = value;
    Py_INCREF(child);
    int failed = 0;
    for (;;) {
        /* ``child`` (owned) is the value to look at next, or NULL. */
        if (child != NULL) {
            if (!depth_is_scalar(child)) {
                DepthLevel lv;
                int rc = depth_open(child, &lv);
                if (rc < 0) {
                    failed = 1;
                    Py_DECREF(child);
                    break;
                }
                if (rc > 0) {
                    if (height == limit) {
                        Py_DECREF(lv.obj);
                        Py_DECREF(child);
                        deepest = limit + 1;
                        break;
                    }
                    if (height == cap) {
                        DepthLevel *bigger = stack == small ? PyMem_Malloc(sizeof(DepthLevel) * (size_t)cap * 2)
                                                            : PyMem_Realloc(stack, sizeof(DepthLevel) * (size_t)cap * 2);
                        if (bigger == NULL) {
                            Py_DECREF(lv.obj);
                            Py_DECREF(child);
                            PyErr_NoMemory();
                            failed = 1;
                            break;
                        }
                        if (stack == small)
                            memcpy(bigger, small, sizeof(small));
                        stack = bigger;
                        cap *= 2;
                    }
                    stack[height++] = lv;
                    if (height > deepest)
                        deepest = height;
                }
            }
            Py_DECREF(child);
            child = NULL;
        }
        if (height == 0)
            break;
        DepthLevel *top = &stack[height - 1];
        int rc = depth_next_child(top, &child);
        if (rc < 0) {
            failed = 1;
            break;
        }
        if (rc == 0) {
            Py_DECREF(top->obj);
            Py_XDECREF(top->next);
            height--;
        }
    }
    while (height > 0) {
        height--;
        Py_DECREF(stack[height].obj);
        Py_XDECREF(stack[height].next);
    }
    if (stack != small)
        PyMem_Free(stack);
    return failed ? -1 : deepest;
}

static int
depth_limit_arg(PyObject *arg, Py_ssize_t *limit)
{
    *limit = PyLong_AsSsize_t(arg);
    if (*limit == -1 && PyErr_Occurred())
        return -1;
    if (*limit < 0 || *limit > 1000000) {
        PyErr_SetString(PyExc_ValueError, "the depth limit must be within 0..1000000");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(nesting_depth_doc,
"nesting_depth(value, limit) -> int\n\n"
"How many containers deep ``value`` nests (0 for a scalar, 1 for a flat list or dict),\n"
"counting lists, tuples, dicts, sets, CBORTag values and other Mappings and Sequences,\n"
"as cbor2 recurses into them; ``limit + 1`` as soon as it is deeper than ``limit``\n"
"(a value that contains itself is). Uses no C recursion.");

/* The arguments (value, limit) of nesting_depth and encode_subset: 0, or -1 with an
 * error set. */
static int
value_and_limit(Py_ssize_t nargs, PyObject *const *args, const char *usage, Py_ssize_t *limit)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    return depth_limit_arg(args[1], limit);
}

static PyObject *
nesting_depth(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t limit;
    if (value_and_limit(nargs, args, "nesting_depth(value, limit) takes 2 arguments", &limit) < 0)
        return NULL;
    Py_ssize_t depth = depth_of(args[0], limit);
    return depth < 0 ? NULL : PyLong_FromSsize_t(depth);
}

/* ---- Records as CBOR, the common subset ------------------------------------------------
 *
 * The writer's encoder for what records are usually made of -- exact dicts, lists and
 * tuples around exact strs, bytes, ints of up to 64 bits, finite and infinite floats,
 * bools and None -- writing exactly the bytes cbor2's encoder writes for them (cbor2
 * 6.x, not canonical: definite lengths, the shortest head, every finite float as a
 * double, dicts in their order). Anything else in a record (another type, a subclass,
 * a bigger int, a NaN, a str with a lone surrogate, nesting deeper than the limit)
 * gives FALLBACK for the whole record, and the caller encodes it with cbor2 as before.
 * So cbor2 stays the reference: this only ever has to agree with it on this subset.
 *
 * The walk runs no Python code and allocates no Python object (so no collection, no
 * finalizer can run and change what it reads); it recurses once per container, at most
 * ``limit`` levels. */

static int
cbor_head(Out *o, unsigned major, uint64_t n)
{
    unsigned char b[9];
    Py_ssize_t len;
    major <<= 5;
    if (n < 24) {
        b[0] = (unsigned char)(major | n);
        len = 1;
    } else if (n < 0x100) {
        b[0] = (unsigned char)(major | 24);
        b[1] = (unsigned char)n;
        len = 2;
    } else if (n < 0x10000) {
        b[0] = (unsigned char)(major | 25);
        b[1] = (unsigned char)(n >> 8);
        b[2] = (unsigned char)n;
        len = 3;
    } else if (n <= 0xFFFFFFFFu) {
        b[0] = (unsigned char)(major | 26);
        for (int i = 0; i < 4; i++)
            b[1 + i] = (unsigned char)(n >> (24 - 8 * i));
        len = 5;
    } else {
        b[0] = (unsigned char)(major | 27);
        for (int i = 0; i < 8; i++)
            b[1 + i] = (unsigned char)(n >> (56 - 8 * i));
        len = 9;
    }
    if (o->len + len > o->cap && out_reserve(o, len) != OK)
        return NOMEM;
    memcpy(o->buf + o->len, b, (size_t)len);
    o->len += len;
    return OK;
}

/* A str as CBOR text: its UTF-8, written from the str's own code points. */
static int
cbor_text(Out *o, PyObject *s)
{
    if (PyUnicode_READY(s) < 0) {
        PyErr_Clear();
        return FALLBACK;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if (PyUnicode_IS_ASCII(s)) {
        if (cbor_head(o, 3, (uint64_t)n) != OK)
            return NOMEM;
        return out_put(o, (const char *)PyUnicode_1BYTE_DATA(s), n);
    }
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    Py_ssize_t size = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c < 0x80)
            size += 1;
        else if (c < 0x800)
            size += 2;
        else if (c >= 0xD800 && c <= 0xDFFF)
            return FALLBACK;  /* a lone surrogate: cbor2 says what it makes of it */
        else if (c < 0x10000)
            size += 3;
        else
            size += 4;
    }
    if (cbor_head(o, 3, (uint64_t)size) != OK || out_reserve(o, size) != OK)
        return NOMEM;
    unsigned char *p = (unsigned char *)o->buf + o->len;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c < 0x80) {
            *p++ = (unsigned char)c;
        } else if (c < 0x800) {
            *p++ = (unsigned char)(0xC0 | (c >> 6));
            *p++ = (unsigned char)(0x80 | (c & 0x3F));
        } else if (c < 0x10000) {
            *p++ = (unsigned char)(0xE0 | (c >> 12));
            *p++ = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
            *p++ = (unsigned char)(0x80 | (c & 0x3F));
        } else {
            *p++ = (unsigned char)(0xF0 | (c >> 18));
            *p++ = (unsigned char)(0x80 | ((c >> 12) & 0x3F));
            *p++ = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
            *p++ = (unsigned char)(0x80 | (c & 0x3F));
        }
    }
    o->len += size;
    return OK;
}

static int
cbor_int(Out *o, PyObject *x)
{
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(x, &overflow);
    if (overflow == 0) {
        if (v == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return FALLBACK;
        }
        return v >= 0 ? cbor_head(o, 0, (uint64_t)v) : cbor_head(o, 1, (uint64_t)(-1 - v));
    }
    if (overflow > 0) {
        unsigned long long u = PyLong_AsUnsignedLongLong(x);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return FALLBACK;  /* past 64 bits: a bignum tag, cbor2's */
        }
        return cbor_head(o, 0, (uint64_t)u);
    }
    return FALLBACK;
}

static int
cbor_float(Out *o, double d)
{
    unsigned char b[9];
    if (isnan(d))
        return FALLBACK;
    if (isinf(d))
        return out_put(o, d > 0 ? "\xf9\x7c\x00" : "\xf9\xfc\x00", 3);
    uint64_t bits;
    memcpy(&bits, &d, 8);
    b[0] = 0xFB;
    for (int i = 0; i < 8; i++)
        b[1 + i] = (unsigned char)(bits >> (56 - 8 * i));
    return out_put(o, (const char *)b, 9);
}

/* ``x`` at ``level`` containers deep (a record's top is 0). */
static int
cbor_value(Out *o, PyObject *x, Py_ssize_t level, Py_ssize_t limit)
{
    PyTypeObject *t = Py_TYPE(x);
    int rc;
    if (t == &PyUnicode_Type)
        return cbor_text(o, x);
    if (t == &PyLong_Type)
        return cbor_int(o, x);
    if (t == &PyDict_Type) {
        if (level >= limit)
            return FALLBACK;
        if ((rc = cbor_head(o, 5, (uint64_t)PyDict_GET_SIZE(x))) != OK)
            return rc;
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(x, &pos, &k, &v)) {
            if ((rc = cbor_value(o, k, level + 1, limit)) != OK || (rc = cbor_value(o, v, level + 1, limit)) != OK)
                return rc;
        }
        return OK;
    }
    if (t == &PyList_Type || t == &PyTuple_Type) {
        if (level >= limit)
            return FALLBACK;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(x);
        PyObject **items = PySequence_Fast_ITEMS(x);
        if ((rc = cbor_head(o, 4, (uint64_t)n)) != OK)
            return rc;
        for (Py_ssize_t i = 0; i < n; i++) {
            if ((rc = cbor_value(o, items[i], level + 1, limit)) != OK)
                return rc;
        }
        return OK;
    }
    if (t == &PyFloat_Type)
        return cbor_float(o, PyFloat_AS_DOUBLE(x));
    if (t == &PyBool_Type)
        return out_put(o, x == Py_True ? "\xf5" : "\xf4", 1);
    if (x == Py_None)
        return out_put(o, "\xf6", 1);
    if (t == &PyBytes_Type) {
        Py_ssize_t n = PyBytes_GET_SIZE(x);
        if ((rc = cbor_head(o, 2, (uint64_t)n)) != OK)
            return rc;
        return out_put(o, PyBytes_AS_STRING(x), n);
    }
    return FALLBACK;
}

/* A scratch buffer the encodings are made in (the GIL is held throughout, and nothing
 * run in between can encode): kept between calls, unless a big record grew it. */
static Out cbor_scratch;
#define CBOR_SCRATCH_KEEP (1 << 16)

/* ``value`` as cbor2 encodes it, as a new bytes object, if ``value`` is of the common
 * subset and nests at most ``limit`` deep; else a new reference to None; NULL with an
 * error set (no memory). */
static PyObject *
cbor_subset_bytes(PyObject *value, Py_ssize_t limit)
{
    Out *o = &cbor_scratch;
    o->len = 0;
    int rc = cbor_value(o, value, 0, limit);
    PyObject *result = rc == OK ? PyBytes_FromStringAndSize(o->buf, o->len)
                     : rc == NOMEM ? PyErr_NoMemory() : Py_NewRef(Py_None);
    if (o->cap > CBOR_SCRATCH_KEEP) {
        PyMem_Free(o->buf);
        o->buf = NULL;
        o->cap = 0;
    }
    o->len = 0;
    return result;
}

PyDoc_STRVAR(encode_subset_doc,
"encode_subset(value, limit) -> bytes | None\n\n"
"``value`` encoded as cbor2 encodes it, if it is made only of exact dicts, lists, tuples,\n"
"strs, bytes, ints of up to 64 bits, non-NaN floats, bools and None, nesting at most\n"
"``limit`` containers deep; None otherwise (encode it with cbor2).");

static PyObject *
encode_subset(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t limit;
    if (value_and_limit(nargs, args, "encode_subset(value, limit) takes 2 arguments", &limit) < 0)
        return NULL;
    return cbor_subset_bytes(args[0], limit);
}

/* depth_checked(): ``encode`` behind the depth check, then ``position()``, as one builtin
 * function whose ``self`` is the tuple (encode, limit, error, position), so that the
 * writer's hot path pays for one call where it would make three, and one the interpreter
 * calls as fast as any builtin. */

static PyObject *
depth_checked_call(PyObject *state, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "a depth-checked encoder takes one value");
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(PyTuple_GET_ITEM(state, 1));
    if (PyTuple_GET_SIZE(state) > 4) {
        /* The common subset, encoded here and written in one call. */
        PyObject *data = cbor_subset_bytes(args[0], limit);
        if (data == NULL)
            return NULL;
        if (data != Py_None) {
            PyObject *written = PyObject_CallOneArg(PyTuple_GET_ITEM(state, 4), data);
            Py_DECREF(data);
            if (written == NULL)
                return NULL;
            Py_DECREF(written);
            return PyObject_CallNoArgs(PyTuple_GET_ITEM(state, 3));
        }
        Py_DECREF(data);
    }
    Py_ssize_t depth = depth_of(args[0], limit);
    if (depth < 0)
        return NULL;
    if (depth > limit) {
        PyObject *exc = PyObject_CallOneArg(PyTuple_GET_ITEM(state, 2), args[0]);
        if (exc != NULL) {
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
            Py_DECREF(exc);
        }
        return NULL;
    }
    PyObject *encoded = PyObject_Vectorcall(PyTuple_GET_ITEM(state, 0), args, 1, NULL);
    if (encoded == NULL)
        return NULL;
    Py_DECREF(encoded);
    return PyObject_CallNoArgs(PyTuple_GET_ITEM(state, 3));
}

static PyMethodDef depth_checked_def = {
    "encode_checked", (PyCFunction)(void (*)(void))depth_checked_call, METH_FASTCALL,
    "encode_checked(value): encode(value) then position(), unless value nests too deep (then raise error(value)).",
};

PyDoc_STRVAR(depth_checked_doc,
"depth_checked(encode, limit, error, position, write=None) -> callable\n\n"
"A callable taking one value: if it nests deeper than ``limit`` (see nesting_depth),\n"
"raises ``error(value)``; otherwise calls ``encode(value)`` and returns ``position()``.\n"
"With ``write``, a value of encode_subset's common subset is encoded here instead, and\n"
"its bytes given to ``write`` (the same bytes cbor2's encoder writes).");

static PyObject *
depth_checked(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t limit;
    if (nargs != 4 && nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "depth_checked(encode, limit, error, position, write=None) takes 4 or 5 arguments");
        return NULL;
    }
    if (!PyCallable_Check(args[0]) || !PyCallable_Check(args[2]) || !PyCallable_Check(args[3])
        || (nargs == 5 && args[4] != Py_None && !PyCallable_Check(args[4]))) {
        PyErr_SetString(PyExc_TypeError, "depth_checked: encode, error, position and write must be callables");
        return NULL;
    }
    if (depth_limit_arg(args[1], &limit) < 0)
        return NULL;
    PyObject *state = nargs == 5 && args[4] != Py_None ? PyTuple_Pack(5, args[0], args[1], args[2], args[3], args[4])
                                                      : PyTuple_Pack(4, args[0], args[1], args[2], args[3]);
    if (state == NULL)
        return NULL;
    PyObject *checked = PyCFunction_NewEx(&depth_checked_def, state, NULL);
    Py_DECREF(state);
    return checked;
}

/* -- record boundaries -------------------------------------------------------------------
 *
 * Where each record of a batch payload starts, without building a Python object, so
 * that readers can decode a batch in slices that stay in the CPU cache instead of in one
 * call that keeps every record of the batch alive at once.
 *
 * The walk accepts only CBOR that cbor2 decodes without fail under persistlog's decoder
 * options: integers, floats, definite-length byte strings, definite-length text strings of
 * valid UTF-8, definite-length arrays and maps, false, true, null and undefined, nested at
 * most BOUNDS_MAX_DEPTH deep. Anything else (tags, whose meaning can fail to decode;
 * indefinite lengths; other simple values; damage; not exactly ``count`` items up to the
 * end) makes the call return None, and the caller decodes the batch whole, as before,
 * which judges the bytes. So when this answers, every slice decodes, and a batch is
 * either replayed whole or reported damaged exactly as the whole-batch decoder would.
 */

#define BOUNDS_MAX_DEPTH 256

/* Steps over one item; FALLBACK if it is outside the subset or runs past the end. */
static int
skip_item(In *in, int depth)
{
    if (depth > BOUNDS_MAX_DEPTH)
        return FALLBACK;
    int major, info;
    uint64_t arg;
    int rc = read_head(in, &major, &arg, &info);
    if (rc != OK)
        return rc;
    switch (major) {
    case 0:
    case 1:
        return OK;
    case 2:
        if (arg > (uint64_t)(in->end - in->p))
            return FALLBACK;
        in->p += arg;
        return OK;
    case 3: {
        if (arg > (uint64_t)(in->end - in->p))
            return FALLBACK;
        const unsigned char *s = in->p;
        Py_ssize_t n = (Py_ssize_t)arg;
        for (Py_ssize_t i = 0; i < n;) {
            if (s[i] < 0x80) {
                i++;
                continue;
            }
            int k = utf8_seq(s + i, n - i);
            if (k == 0)
                return FALLBACK;
            i += k;
        }
        in->p += n;
        return OK;
    }
    case 4:
    case 5: {
        /* Each item takes a byte at least: a count the bytes cannot hold is damage. */
        uint64_t items = arg;
        if (major == 5) {
            if (items > (uint64_t)(in->end - in->p) / 2)
                return FALLBACK;
            items *= 2;
        } else if (items > (uint64_t)(in->end - in->p)) {
            return FALLBACK;
        }
        for (uint64_t i = 0; i < items; i++) {
            if ((rc = skip_item(in, depth + 1)) != OK)
                return rc;
        }
        return OK;
    }
    case 6:
        return FALLBACK;
    default:
        switch (info) {
        case 20: case 21: case 22: case 23: case 25: case 26: case 27:
            return OK;
        default:
            return FALLBACK;
        }
    }
}

PyDoc_STRVAR(record_bounds_doc,
"record_bounds(payload, count, skip, slice_bytes) -> (indices, offsets) or None\n\n"
"Walks the ``count`` CBOR items of ``payload`` without decoding them. The first\n"
"``skip`` items are stepped over; the records after them are cut into slices of about\n"
"``slice_bytes`` bytes: ``indices[i]`` is the index (counted after the skipped items) of\n"
"the first record of slice i and ``offsets[i]`` its byte offset; the last entries are\n"
"the record count and len(payload). None if the items are not exactly ``count``\n"
"items of the subset cbor2 always decodes: decode the payload whole then.");

static PyObject *
record_bounds(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t count, skip, slice_bytes;
    if (!PyArg_ParseTuple(args, "y*nnn:record_bounds", &view, &count, &skip, &slice_bytes))
        return NULL;
    PyObject *indices = NULL, *offsets = NULL, *result = NULL;
    const unsigned char *base = (const unsigned char *)view.buf;
    In in = {base, base + view.len};
    int rc = OK;
    if (count < 0 || skip < 0 || skip > count || count > view.len || slice_bytes < 1) {
        rc = FALLBACK;
        goto done;
    }
    indices = PyList_New(0);
    offsets = PyList_New(0);
    if (indices == NULL || offsets == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < skip && rc == OK; i++)
        rc = skip_item(&in, 0);
    Py_ssize_t start = in.p - base; /* where the current slice began */
    for (Py_ssize_t i = skip; i <= count && rc == OK; i++) {
        Py_ssize_t at = in.p - base;
        if (i == skip || i == count || at - start >= slice_bytes) {
            PyObject *index = PyLong_FromSsize_t(i - skip);
            PyObject *offset = PyLong_FromSsize_t(at);
            int bad = index == NULL || offset == NULL || PyList_Append(indices, index) < 0
                || PyList_Append(offsets, offset) < 0;
            Py_XDECREF(index);
            Py_XDECREF(offset);
            if (bad)
                goto done;
            start = at;
        }
        if (i < count)
            rc = skip_item(&in, 0);
    }
    if (rc == OK && in.p != in.end)
        rc = FALLBACK;
    if (rc == OK)
        result = PyTuple_Pack(2, indices, offsets);
done:
    Py_XDECREF(indices);
    Py_XDECREF(offsets);
    PyBuffer_Release(&view);
    if (rc == NOMEM)
        return PyErr_NoMemory();
    if (rc == FALLBACK && !PyErr_Occurred())
        Py_RETURN_NONE;
    return result;
}

/* -- records as Python values --------------------------------------------------------------
 *
 * The records of one slice built straight from their bytes: the values cbor2 decodes
 * (lists, dicts, str, bytes, int, float, bool, None) for the subset the boundary finder
 * vouches for, without cbor2's per-item machinery for tags, sharing and immutability.
 * Short text strings are shared: the same bytes give the same str object (a small
 * direct-mapped cache), so map keys repeated in every record are not rebuilt, nor hashed
 * again when they go into a dict. Anything this does not build the way cbor2 would (a
 * container as a map key, undefined) returns None: the caller decodes with cbor2.
 */

#ifndef SHARED_TEXT_MAX
#define SHARED_TEXT_MAX 24
#endif
#define SHARED_TEXT_SLOTS 512

typedef struct {
    PyObject *text; /* a str, or NULL */
    Py_ssize_t n;
    unsigned char bytes[SHARED_TEXT_MAX];
} SharedText;

/* Process-wide, guarded by the GIL: nothing in a lookup releases it. */
static SharedText shared_text[SHARED_TEXT_SLOTS];

static PyObject *
text_value(const unsigned char *s, Py_ssize_t n)
{
    if (n > SHARED_TEXT_MAX)
        return PyUnicode_DecodeUTF8((const char *)s, n, "strict");
    uint32_t h = 2166136261u; /* FNV-1a */
    for (Py_ssize_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 16777619u;
    SharedText *slot = &shared_text[(h ^ (uint32_t)n) & (SHARED_TEXT_SLOTS - 1)];
    if (slot->text != NULL && slot->n == n && memcmp(slot->bytes, s, (size_t)n) == 0) {
        Py_INCREF(slot->text);
        return slot->text;
    }
    PyObject *text = PyUnicode_DecodeUTF8((const char *)s, n, "strict");
    if (text == NULL)
        return NULL;
    Py_XSETREF(slot->text, Py_NewRef(text));
    slot->n = n;
    memcpy(slot->bytes, s, (size_t)n);
    return text;
}

/* One item as a Python value; NULL with no error set means "not built here". */
static PyObject *
build_item(In *in, int depth, int as_key)
{
    if (depth > BOUNDS_MAX_DEPTH)
        return NULL;
    int major, info;
    uint64_t arg;
    if (read_head(in, &major, &arg, &info) != OK)
        return NULL;
    switch (major) {
    case 0:
        return PyLong_FromUnsignedLongLong(arg);
    case 1:
        if (arg <= (uint64_t)INT64_MAX)
            return PyLong_FromLongLong(-1 - (long long)arg);
        else {
            PyObject *u = PyLong_FromUnsignedLongLong(arg);
            if (u == NULL)
                return NULL;
            PyObject *minus_one = PyLong_FromLong(-1);
            PyObject *r = minus_one == NULL ? NULL : PyNumber_Subtract(minus_one, u);
            Py_XDECREF(minus_one);
            Py_DECREF(u);
            return r;
        }
    case 2:
        if (arg > (uint64_t)(in->end - in->p))
            return NULL;
        in->p += arg;
        return PyBytes_FromStringAndSize((const char *)in->p - arg, (Py_ssize_t)arg);
    case 3:
        if (arg > (uint64_t)(in->end - in->p))
            return NULL;
        in->p += arg;
        return text_value(in->p - arg, (Py_ssize_t)arg);
    case 4: {
        if (as_key || arg > (uint64_t)(in->end - in->p))
            return NULL; /* cbor2 makes a tuple of an array used as a key */
        PyObject *list = PyList_New((Py_ssize_t)arg);
        if (list == NULL)
            return NULL;
        for (uint64_t i = 0; i < arg; i++) {
            PyObject *v = build_item(in, depth + 1, 0);
            if (v == NULL) {
                Py_DECREF(list);
                return NULL;
            }
            PyList_SET_ITEM(list, (Py_ssize_t)i, v);
        }
        return list;
    }
    case 5: {
        if (as_key || arg > (uint64_t)(in->end - in->p) / 2)
            return NULL;
        PyObject *dict = PyDict_New();
        if (dict == NULL)
            return NULL;
        for (uint64_t i = 0; i < arg; i++) {
            PyObject *k = build_item(in, depth + 1, 1);
            if (k == NULL) {
                Py_DECREF(dict);
                return NULL;
            }
            PyObject *v = build_item(in, depth + 1, 0);
            if (v == NULL || PyDict_SetItem(dict, k, v) < 0) {
                Py_DECREF(k);
                Py_XDECREF(v);
                Py_DECREF(dict);
                return NULL;
            }
            Py_DECREF(k);
            Py_DECREF(v);
        }
        return dict;
    }
    case 6:
        return NULL;
    default:
        switch (info) {
        case 20: Py_RETURN_FALSE;
        case 21: Py_RETURN_TRUE;
        case 22: Py_RETURN_NONE;
        case 25: return PyFloat_FromDouble(half_to_double((uint16_t)arg));
        case 26: {
            uint32_t bits = (uint32_t)arg;
            float f;
            memcpy(&f, &bits, sizeof f);
            return PyFloat_FromDouble((double)f);
        }
        case 27: {
            double d;
            memcpy(&d, &arg, sizeof d);
            return PyFloat_FromDouble(d);
        }
        default:
            return NULL; /* undefined and other simple values: cbor2's objects */
        }
    }
}

PyDoc_STRVAR(decode_slice_doc,
"decode_slice(payload, start, end, count) -> list or None\n\n"
"The ``count`` records in ``payload[start:end]`` as the Python values cbor2 decodes,\n"
"for bytes record_bounds vouched for. None if they hold anything built otherwise here\n"
"(a container as a map key, undefined, ...): decode them with cbor2 then.");

static PyObject *
decode_slice(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t start, end, count;
    if (!PyArg_ParseTuple(args, "y*nnn:decode_slice", &view, &start, &end, &count))
        return NULL;
    PyObject *list = NULL;
    if (start < 0 || end > view.len || start > end || count < 0 || count > end - start)
        goto fallback;
    In in = {(const unsigned char *)view.buf + start, (const unsigned char *)view.buf + end};
    list = PyList_New(count);
    if (list == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *v = build_item(&in, 0, 0);
        if (v == NULL)
            goto fallback;
        PyList_SET_ITEM(list, i, v);
    }
    if (in.p != in.end)
        goto fallback;
    goto done;
fallback:
    Py_CLEAR(list);
    if (!PyErr_Occurred()) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    /* A str cbor2 would refuse too, or memory: the caller decodes with cbor2, which
     * reports it as it always did. */
    if (!PyErr_ExceptionMatches(PyExc_MemoryError)) {
        PyErr_Clear();
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
done:
    PyBuffer_Release(&view);
    return list;
}

/* -- the batch buffer's hot path ----------------------------------------------------------
 *
 * Staging is the base type of persistlog._write.batch_buffer.BatchBuffer where this module is
 * built: it holds the fields an append touches (the buffer's end, the next LSN, the cut
 * rule's two bounds, the blocked flag, the encoder) and the buffer's lock, and
 * ``_stage_fast(record, snapshot=False)`` is BatchBuffer.stage()'s usual case as one call: take the lock,
 * encode (the depth-checked encoder, returning the buffer's new end), advance the end and
 * the LSN, apply the cut rule, let the lock go. No Python code runs between taking the lock
 * and letting it go but the encoder's, so a KeyboardInterrupt never leaves the lock held:
 * raised inside the encoder, the buffer is marked blocked (its partly encoded record is cut
 * before the next append, by the Python slow path), the lock is let go, and the interrupt
 * propagates as itself. Every other case -- a blocked buffer, a record over the size
 * limit -- is BatchBuffer.stage()'s, in Python, as where this is not built.
 *
 * The lock is this object's own (``with self._lock:`` in BatchBuffer: ``_lock`` is the
 * object itself, a context manager); a wait for it can be interrupted, as threading.Lock's. */

typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock;
    char locked;
    char blocked;
    Py_ssize_t pos;
    Py_ssize_t batch_bytes;
    Py_ssize_t max_record;
    long long next_lsn;
    long long cut_lsn;
    long long first;
    PyObject *encode;
    PyObject *snap;
} Staging;

static PyObject *str_stage, *str_take_back, *str_encode_failed;

static int
staging_acquire(Staging *self)
{
    if (!PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) {
        for (;;) {
            PyLockStatus r;
            Py_BEGIN_ALLOW_THREADS
            r = PyThread_acquire_lock_timed(self->lock, -1, 1);
            Py_END_ALLOW_THREADS
            if (r == PY_LOCK_ACQUIRED)
                break;
            if (r == PY_LOCK_INTR) {
                /* A signal: run its handler, which may raise (KeyboardInterrupt). */
                if (Py_MakePendingCalls() < 0)
                    return -1;
                continue;
            }
            PyErr_SetString(PyExc_RuntimeError, "cannot take the batch buffer's lock");
            return -1;
        }
    }
    self->locked = 1;
    return 0;
}

static void
staging_release(Staging *self)
{
    self->locked = 0;
    PyThread_release_lock(self->lock);
}

static PyObject *
staging_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    Staging *self = (Staging *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->lock = PyThread_allocate_lock();
    if (self->lock == NULL) {
        Py_DECREF(self);
        PyErr_NoMemory();
        return NULL;
    }
    self->max_record = PY_SSIZE_T_MAX;
    return (PyObject *)self;
}

static int
staging_init(Staging *self, PyObject *args, PyObject *kwds)
{
    Py_ssize_t max_record;
    static char *kwlist[] = {"max_record", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n:Staging", kwlist, &max_record))
        return -1;
    if (max_record < 0) {
        PyErr_SetString(PyExc_ValueError, "max_record must not be negative");
        return -1;
    }
    self->max_record = max_record;
    return 0;
}

static int
staging_traverse(Staging *self, visitproc visit, void *arg)
{
    Py_VISIT(self->encode);
    Py_VISIT(self->snap);
    return 0;
}

static int
staging_clear(Staging *self)
{
    Py_CLEAR(self->encode);
    Py_CLEAR(self->snap);
    return 0;
}

/* Only ever the base of BatchBuffer (a heap type): subtype_dealloc lets the type go. */
static void
staging_dealloc(Staging *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    staging_clear(self);
    if (self->lock != NULL) {
        if (self->locked)
            PyThread_release_lock(self->lock);
        PyThread_free_lock(self->lock);
    }
    tp->tp_free((PyObject *)self);
}

/* A snapshot record at ``off`` (from the buffer's first LSN) joins the runs of snapshot
 * records ([start, end, start, end...], BatchBuffer._add_snapshots): a run that ends there
 * grows. On failure (memory) the runs are as they were. */
static int
staging_add_snapshot(Staging *self, long long off)
{
    PyObject *runs = self->snap;
    PyObject *start = NULL, *end = PyLong_FromLongLong(off + 1);
    if (end == NULL)
        return -1;
    if (runs == NULL || runs == Py_None) {
        runs = PyList_New(2);
        start = PyLong_FromLongLong(off);
        if (runs == NULL || start == NULL)
            goto fail;
        PyList_SET_ITEM(runs, 0, start);
        PyList_SET_ITEM(runs, 1, end);
        Py_XSETREF(self->snap, runs);
        return 0;
    }
    if (!PyList_Check(runs)) {
        PyErr_SetString(PyExc_TypeError, "_snap must be a list or None");
        Py_DECREF(end);
        return -1;
    }
    Py_INCREF(runs);
    Py_ssize_t n = PyList_GET_SIZE(runs);
    if (n >= 2) {
        PyObject *last = PyList_GET_ITEM(runs, n - 1);
        long long at = PyLong_AsLongLong(last);
        if (at == -1 && PyErr_Occurred())
            goto fail;
        if (at == off) {
            PyList_SET_ITEM(runs, n - 1, end);  /* steals end */
            Py_DECREF(last);
            Py_DECREF(runs);
            return 0;
        }
    }
    start = PyLong_FromLongLong(off);
    if (start == NULL || PyList_Append(runs, start) < 0)
        goto fail;
    if (PyList_Append(runs, end) < 0) {
        PyObject *err_type, *err_value, *err_tb;
        PyErr_Fetch(&err_type, &err_value, &err_tb);
        (void)PyList_SetSlice(runs, n, n + 1, NULL);  /* the start goes again */
        PyErr_Restore(err_type, err_value, err_tb);
        goto fail;
    }
    Py_DECREF(start);
    Py_DECREF(end);
    Py_DECREF(runs);
    return 0;
fail:
    Py_XDECREF(start);
    Py_DECREF(end);
    Py_XDECREF(runs);
    return -1;
}

/* The slow path: BatchBuffer.stage(record, snapshot), which takes the lock itself. */
static PyObject *
staging_slow(Staging *self, PyObject *record, PyObject *snapshot)
{
    PyObject *args[3] = {(PyObject *)self, record, snapshot};
    return PyObject_VectorcallMethod(str_stage, args, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

static PyObject *
staging_stage_fast(Staging *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1 && nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_stage_fast(record, snapshot=False) takes 1 or 2 arguments");
        return NULL;
    }
    int snapshot = 0;
    if (nargs == 2 && args[1] != Py_False) {
        if (args[1] != Py_True)
            return staging_slow(self, args[0], args[1]);
        snapshot = 1;
    }
    if (staging_acquire(self) < 0)
        return NULL;
    if (self->blocked || self->encode == NULL) {
        staging_release(self);
        return staging_slow(self, args[0], snapshot ? Py_True : Py_False);
    }
    PyObject *encode = self->encode;
    Py_INCREF(encode);
    PyObject *endobj = PyObject_Vectorcall(encode, args, 1, NULL);
    Py_DECREF(encode);
    Py_ssize_t end = -1;
    if (endobj != NULL) {
        end = PyLong_AsSsize_t(endobj);
        Py_DECREF(endobj);
    }
    if (end < 0) {
        /* The encoder failed, or was interrupted: what it wrote of the record is cut
         * before the next append. */
        self->blocked = 1;
        staging_release(self);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_SystemError, "the record encoder returned a negative position");
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return NULL;  /* KeyboardInterrupt, SystemExit...: as themselves */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL)
            PyException_SetTraceback(value, tb);
        Py_XDECREF(type);
        Py_XDECREF(tb);
        /* raises the encode error made of it (BatchBuffer._encode_failed) */
        PyObject *r = PyObject_CallMethodOneArg((PyObject *)self, str_encode_failed, value);
        Py_DECREF(value);
        Py_XDECREF(r);
        if (r != NULL) {
            PyErr_SetString(PyExc_SystemError, "_encode_failed returned");
        }
        return NULL;
    }
    if (end > self->max_record) {
        /* Too big for the buffer: its bytes go through the slow path's append_encoded(). */
        self->blocked = 1;
        PyObject *pos = PyLong_FromSsize_t(self->pos), *endo = PyLong_FromSsize_t(end);
        PyObject *data = NULL;
        if (pos != NULL && endo != NULL)
            data = PyObject_CallMethodObjArgs((PyObject *)self, str_take_back, pos, endo, NULL);
        Py_XDECREF(pos);
        Py_XDECREF(endo);
        staging_release(self);
        return data;
    }
    long long lsn = self->next_lsn;
    if (snapshot && staging_add_snapshot(self, lsn - self->first) < 0) {
        /* Out of memory: the record is cut as an interrupted one. */
        self->blocked = 1;
        staging_release(self);
        return NULL;
    }
    self->pos = end;
    self->next_lsn = lsn + 1;
    /* The cut rule (BatchBuffer.hand_over_due): the cut LSN is the updates' alone. */
    int due = end >= self->batch_bytes || (!snapshot && lsn >= self->cut_lsn);
    staging_release(self);
    PyObject *lsn_obj = PyLong_FromLongLong(lsn);
    if (lsn_obj == NULL || !due)
        return lsn_obj;
    PyObject *t = PyTuple_New(1);
    if (t == NULL) {
        Py_DECREF(lsn_obj);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 0, lsn_obj);
    return t;
}

static PyObject *
staging_enter(Staging *self, PyObject *unused)
{
    if (staging_acquire(self) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

static PyObject *
staging_exit(Staging *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!self->locked) {
        PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
        return NULL;
    }
    staging_release(self);
    Py_RETURN_NONE;
}

static PyObject *
staging_get_lock(Staging *self, void *closure)
{
    return Py_NewRef(self);
}

static PyMethodDef staging_methods[] = {
    {"_stage_fast", (PyCFunction)(void (*)(void))staging_stage_fast, METH_FASTCALL,
     "_stage_fast(record, snapshot=False): stage(record, snapshot), its usual case in C."},
    {"__enter__", (PyCFunction)staging_enter, METH_NOARGS, "Take the buffer's lock."},
    {"__exit__", (PyCFunction)(void (*)(void))staging_exit, METH_FASTCALL, "Let the buffer's lock go."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef staging_members[] = {
    {"_pos", T_PYSSIZET, offsetof(Staging, pos), 0, "the end of the last whole record"},
    {"_batch_bytes", T_PYSSIZET, offsetof(Staging, batch_bytes), 0, "the batch size that hands a batch over"},
    {"_next_lsn", T_LONGLONG, offsetof(Staging, next_lsn), 0, "the LSN the next record gets"},
    {"_first", T_LONGLONG, offsetof(Staging, first), 0, "the LSN of the buffer's first record"},
    {"_snap", T_OBJECT, offsetof(Staging, snap), 0, "snapshot records' runs of offsets from _first, [start, end...] (a list, or None)"},
    {"_cut_lsn", T_LONGLONG, offsetof(Staging, cut_lsn), 0, "the LSN that hands a batch over"},
    {"_blocked", T_BOOL, offsetof(Staging, blocked), 0, "appends take the slow path"},
    {"_enc_encode", T_OBJECT_EX, offsetof(Staging, encode), 0, "encode(record) -> the buffer's new end"},
    {NULL},
};

static PyGetSetDef staging_getset[] = {
    {"_lock", (getter)staging_get_lock, NULL, "the buffer's lock (a context manager: this object)", NULL},
    {NULL},
};

static PyTypeObject StagingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "persistlog._cbor_json.Staging",
    .tp_doc = PyDoc_STR("Staging(max_record): the batch buffer's hot fields, its lock, and _stage_fast()."),
    .tp_basicsize = sizeof(Staging),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = staging_new,
    .tp_init = (initproc)staging_init,
    .tp_dealloc = (destructor)staging_dealloc,
    .tp_traverse = (traverseproc)staging_traverse,
    .tp_clear = (inquiry)staging_clear,
    .tp_methods = staging_methods,
    .tp_members = staging_members,
    .tp_getset = staging_getset,
};

/* -- batches checked in runs -----------------------------------------------------------------
 *
 * The reader's batch checks (LogScanner in persistlog/_read/reader.py): consecutive batches of
 * one segment, read from the reader's window, each checked as docs/FORMAT.md says a batch is
 * checked -- header checksum, marker, flags, lengths, payload checksum, hash link against
 * the hash of the batch before it -- and hashed for the next link (the LSNs the reader
 * checks after the run, as after its own checks). It takes the usual batches only:
 * uncompressed, clear, sharing no values, whole in the window and smaller than the batches
 * the reader hashes off its thread. At the first batch it does not take, for whatever
 * reason (damage of any kind, another kind of batch, the window's end), the run ends and
 * the reader's Python path reads that batch. So every verdict on bytes that are not well
 * formed, and every message, stays the Python decoder's (persistlog/_format/decoder.py):
 * this code judges nothing, it only vouches for batches.
 *
 * The checksums are zlib's CRC-32 (computed here for a few bytes, by zlib.crc32 past that),
 * the hashes hashlib.sha256's, called as the Python path calls it (with the CPU's SHA
 * instructions where OpenSSL has them).
 */

/* The batch header (docs/FORMAT.md, "Batch"): stored length, raw length, record count
 * (u32 each), flags (u16), marker "PB", first LSN (u64), commit time (i64), payload CRC
 * (u32), then the CRC of those 36 bytes; little-endian. */
#define BATCH_HEADER_SIZE 40
#define BATCH_HEADER_BODY 36
#define LINK_SIZE 32
#define MAX_BATCH_BYTES (64u * 1024u * 1024u)
#define COMPRESSION_MASK 0x000Cu
#define FLAG_LINKED 0x0010u
#define FLAG_ENCRYPTED 0x0020u
#define FLAG_SHARED 0x0040u
#define KNOWN_FLAGS 0x007Fu

/* Below this many bytes a CRC is computed here, a byte at a time, faster than a call to
 * zlib.crc32 costs; zlib's is several times faster on longer runs. */
#define CRC_HERE_BYTES 256
static uint32_t crc_table[256];

static void
crc_table_fill(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

static PyObject *crc32_func, *sha256_func, *str_digest;

/* zlib.crc32 and hashlib.sha256, imported on the first run. */
static int
runs_ready(void)
{
    static const char *const modules[] = {"zlib", "hashlib"};
    static const char *const names[] = {"crc32", "sha256"};
    PyObject **const out[] = {&crc32_func, &sha256_func};
    if (str_digest != NULL)
        return 0;
    if (import_attributes(2, modules, names, out) < 0)
        return -1;
    crc_table_fill();
    if ((str_digest = PyUnicode_InternFromString("digest")) == NULL) {
        Py_CLEAR(crc32_func);
        Py_CLEAR(sha256_func);
        return -1;
    }
    return 0;
}

static uint32_t
le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t
le64(const unsigned char *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

/* The CRC-32 (zlib's) of the n bytes at p; -1 with an error set. */
static long long
crc_of(const unsigned char *p, Py_ssize_t n)
{
    if (n < CRC_HERE_BYTES) {
        uint32_t c = 0xFFFFFFFFu;
        for (Py_ssize_t i = 0; i < n; i++)
            c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
        return (long long)(c ^ 0xFFFFFFFFu);
    }
    PyObject *view = PyMemoryView_FromMemory((char *)p, n, PyBUF_READ);
    if (view == NULL)
        return -1;
    PyObject *crc = PyObject_CallOneArg(crc32_func, view);
    Py_DECREF(view);
    if (crc == NULL)
        return -1;
    unsigned long long v = PyLong_AsUnsignedLongLong(crc);
    Py_DECREF(crc);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    return (long long)v;
}

/* hashlib.sha256(the n bytes at p).digest(): a new bytes object of LINK_SIZE bytes; NULL
 * with an error set. */
static PyObject *
sha256_of(const unsigned char *p, Py_ssize_t n)
{
    PyObject *view = PyMemoryView_FromMemory((char *)p, n, PyBUF_READ);
    if (view == NULL)
        return NULL;
    PyObject *h = PyObject_CallOneArg(sha256_func, view);
    Py_DECREF(view);
    if (h == NULL)
        return NULL;
    PyObject *digest = PyObject_CallMethodNoArgs(h, str_digest);
    Py_DECREF(h);
    if (digest != NULL && (!PyBytes_Check(digest) || PyBytes_GET_SIZE(digest) != LINK_SIZE)) {
        Py_DECREF(digest);
        PyErr_SetString(PyExc_SystemError, "hashlib.sha256 gave no 32-byte digest");
        return NULL;
    }
    return digest;
}

/* The header object: an instance of the class the reader passes (decoder.BatchHeader, a
 * frozen dataclass with slots), its slots filled in through their member descriptors, as
 * its __init__ fills them, for a fraction of the cost; a class whose fields are not slots
 * is called. */
#define HEADER_FIELDS 7
static const char *const header_fields[HEADER_FIELDS] = {
    "stored_len", "raw_len", "count", "flags", "first_lsn", "commit_us", "payload_crc",
};
static PyObject *header_class;
static PyObject *header_slots[HEADER_FIELDS];

static int
header_class_is(PyObject *cls)
{
    if (cls == header_class)
        return 0;
    PyObject *slots[HEADER_FIELDS] = {NULL};
    int all = PyType_Check(cls);
    for (int i = 0; all && i < HEADER_FIELDS; i++) {
        slots[i] = PyObject_GetAttrString(cls, header_fields[i]);
        if (slots[i] == NULL) {
            for (int j = 0; j < i; j++)
                Py_DECREF(slots[j]);
            return -1;
        }
        all = Py_IS_TYPE(slots[i], &PyMemberDescr_Type);
    }
    for (int i = 0; i < HEADER_FIELDS; i++) {
        Py_CLEAR(header_slots[i]);
        header_slots[i] = all ? slots[i] : NULL;
        if (!all)
            Py_XDECREF(slots[i]);
    }
    Py_INCREF(cls);
    Py_XSETREF(header_class, cls);
    return 0;
}

static PyObject *
header_object(PyObject *const values[HEADER_FIELDS])
{
    if (header_slots[0] == NULL)
        return PyObject_Vectorcall(header_class, values, HEADER_FIELDS, NULL);
    PyTypeObject *tp = (PyTypeObject *)header_class;
    PyObject *h = tp->tp_alloc(tp, 0);
    if (h == NULL)
        return NULL;
    for (int i = 0; i < HEADER_FIELDS; i++) {
        if (Py_TYPE(header_slots[i])->tp_descr_set(header_slots[i], h, values[i]) < 0) {
            Py_DECREF(h);
            return NULL;
        }
    }
    return h;
}

/* The batch at p, which checks out (``linked``: it carries a link; its payload is
 * ``raw`` bytes after it), as the run's item (end, header, payload, link, hash). */
static PyObject *
run_item(const unsigned char *p, Py_ssize_t end, uint32_t raw, int linked, PyObject *digest)
{
    PyObject *values[HEADER_FIELDS] = {
        PyLong_FromUnsignedLong(le32(p)), PyLong_FromUnsignedLong(raw), PyLong_FromUnsignedLong(le32(p + 8)),
        PyLong_FromUnsignedLong((unsigned long)p[12] | (unsigned long)p[13] << 8),
        PyLong_FromUnsignedLongLong(le64(p + 16)), PyLong_FromLongLong((long long)le64(p + 24)),
        PyLong_FromUnsignedLong(le32(p + 32)),
    };
    PyObject *item = NULL;
    int made = 1;
    for (int i = 0; i < HEADER_FIELDS; i++)
        made = made && values[i] != NULL;
    PyObject *header = made ? header_object(values) : NULL;
    const unsigned char *payload = p + BATCH_HEADER_SIZE + (linked ? LINK_SIZE : 0);
    PyObject *data = header == NULL ? NULL : PyBytes_FromStringAndSize((const char *)payload, raw);
    PyObject *link = data == NULL ? NULL
                   : linked ? PyBytes_FromStringAndSize((const char *)p + BATCH_HEADER_SIZE, LINK_SIZE)
                   : Py_NewRef(Py_None);
    PyObject *at = link == NULL ? NULL : PyLong_FromSsize_t(end);
    if (at != NULL)
        item = PyTuple_Pack(5, at, header, data, link, digest != NULL ? digest : Py_None);
    for (int i = 0; i < HEADER_FIELDS; i++)
        Py_XDECREF(values[i]);
    Py_XDECREF(header);
    Py_XDECREF(data);
    Py_XDECREF(link);
    Py_XDECREF(at);
    return item;
}

PyDoc_STRVAR(checked_batches_doc,
"checked_batches(window, base, pos, stop, size, link, chained, under, budget, header_class)\n"
"-> [(end, header, payload, link, hash), ...]\n\n"
"The run of batches from offset ``pos`` of a segment of ``size`` bytes, of which\n"
"``window`` holds the bytes from offset ``base`` on, that check out: each starts before\n"
"``stop``, ends in the window, is smaller than ``under`` bytes, is uncompressed, clear and\n"
"shares no values, passes every check of its header and payload, and carries a link if and\n"
"only if ``chained``, equal to ``link`` (None: any) or to the hash of the batch before it. The run\n"
"ends at the first batch that does not, or once it holds ``budget`` bytes. ``header`` is a\n"
"``header_class`` of the header's fields, ``payload`` the bytes after the link, ``link`` the\n"
"link (None if none), ``hash`` the SHA-256 of the whole batch (None if unlinked).");

static PyObject *
checked_batches(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t base, pos, stop, size, under, budget;
    PyObject *link_obj, *cls;
    int chained;
    if (!PyArg_ParseTuple(args, "y*nnnnOpnnO:checked_batches", &view, &base, &pos, &stop, &size, &link_obj,
                          &chained, &under, &budget, &cls))
        return NULL;
    PyObject *run = NULL;
    if (runs_ready() < 0 || header_class_is(cls) < 0 || (run = PyList_New(0)) == NULL)
        goto done;
    const unsigned char *expect = NULL;
    if (link_obj != Py_None) {
        if (!PyBytes_Check(link_obj) || PyBytes_GET_SIZE(link_obj) != LINK_SIZE)
            goto done;
        expect = (const unsigned char *)PyBytes_AS_STRING(link_obj);
    }
    const unsigned char *data = (const unsigned char *)view.buf;
    Py_ssize_t limit = base + view.len < size ? base + view.len : size;
    Py_ssize_t held = 0;
    while (pos < stop && held < budget && pos >= base && pos <= limit - BATCH_HEADER_SIZE) {
        const unsigned char *p = data + (pos - base);
        uint32_t stored = le32(p), raw = le32(p + 4), count = le32(p + 8);
        unsigned flags = (unsigned)p[12] | (unsigned)p[13] << 8;
        int linked = (flags & FLAG_LINKED) != 0;
        uint32_t link_len = linked ? LINK_SIZE : 0;
        if (p[14] != 'P' || p[15] != 'B' || flags & ~KNOWN_FLAGS
            || flags & (COMPRESSION_MASK | FLAG_ENCRYPTED | FLAG_SHARED) || linked != chained
            || stored > MAX_BATCH_BYTES || raw > MAX_BATCH_BYTES || stored < link_len || stored - link_len != raw
            || count > (raw > 1 ? raw : 1) || (count == 0 && raw != 0))
            break;
        Py_ssize_t end = pos + BATCH_HEADER_SIZE + (Py_ssize_t)stored;
        if (end > limit || end - pos >= under
            || (linked && expect != NULL && memcmp(p + BATCH_HEADER_SIZE, expect, LINK_SIZE) != 0))
            break;
        long long crc = crc_of(p, BATCH_HEADER_BODY);
        if (crc < 0)
            goto fail;
        if ((uint32_t)crc != le32(p + BATCH_HEADER_BODY))
            break;
        if ((crc = crc_of(p + BATCH_HEADER_SIZE, (Py_ssize_t)stored)) < 0)
            goto fail;
        if ((uint32_t)crc != le32(p + 32))
            break;
        PyObject *digest = NULL;
        if (linked && (digest = sha256_of(p, end - pos)) == NULL)
            goto fail;
        PyObject *item = run_item(p, end, raw, linked, digest);
        Py_XDECREF(digest); /* the item holds it, and the run the item */
        if (item == NULL || PyList_Append(run, item) < 0) {
            Py_XDECREF(item);
            goto fail;
        }
        Py_DECREF(item);
        if (linked)
            expect = (const unsigned char *)PyBytes_AS_STRING(digest);
        held += end - pos;
        pos = end;
    }
    goto done;
fail:
    Py_CLEAR(run);
done:
    PyBuffer_Release(&view);
    return run;
}

static PyMethodDef methods[] = {
    {"records", records, METH_VARARGS, records_doc},
    {"nesting_depth", (PyCFunction)(void (*)(void))nesting_depth, METH_FASTCALL, nesting_depth_doc},
    {"depth_checked", (PyCFunction)(void (*)(void))depth_checked, METH_FASTCALL, depth_checked_doc},
    {"encode_subset", (PyCFunction)(void (*)(void))encode_subset, METH_FASTCALL, encode_subset_doc},
    {"record_bounds", record_bounds, METH_VARARGS, record_bounds_doc},
    {"decode_slice", decode_slice, METH_VARARGS, decode_slice_doc},
    {"checked_batches", checked_batches, METH_VARARGS, checked_batches_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "persistlog._cbor_json",
    "CBOR records as JSON text by docs/JSON.md, for the common subset of CBOR.",
    -1,
    methods,
};

PyMODINIT_FUNC
PyInit__cbor_json(void)
{
    str_stage = PyUnicode_InternFromString("stage");
    str_take_back = PyUnicode_InternFromString("_take_back");
    str_encode_failed = PyUnicode_InternFromString("_encode_failed");
    if (str_stage == NULL || str_take_back == NULL || str_encode_failed == NULL)
        return NULL;
    if (PyType_Ready(&StagingType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&StagingType);
    if (PyModule_AddObject(m, "Staging", (PyObject *)&StagingType) < 0) {
        Py_DECREF(&StagingType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
