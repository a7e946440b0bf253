/* Line protocol cut into columns in one pass over a chunk of whole lines, without the GIL.
 *
 * Only lines of the plain shape are read here: `series fieldset timestamp`, no backslash, carriage
 * return or control byte up to 3, nothing before the series, quotes only around a string field's
 * value (closed before the next comma or space), each field once, none named `time`, every value
 * spelled in a form influxd reads to the same value (a double that overflows is not one). Any other
 * line is set aside by number and start, and the Python module reads it as influxd would
 * (`lp_grammar`), which skips it, reads it or names what is wrong with it. So this code never has
 * to report an error: it only has to be right about what it accepts. Such a line also ends at its
 * newline for influxd (no quote or escape can carry it on), so the lines set aside are the only ones
 * whose end the Python side must look for. The series (up to the first space) are checked there too,
 * once per distinct text.
 *
 * Series (measurement and tags, up to the first space) are numbered by a hash table; the Python
 * side splits each distinct series once. Field values are typed by their spelling and parsed
 * here: a cell is (row, key, kind, value), the value a double's bits, an integer, a boolean, or
 * for a string the offset of its text (low 32 bits) and its length (high 32 bits). Cells are returned
 * grouped by key, with each key's count and the kinds it is spelled in, and the string values copied
 * end to end in that order.
 *
 * An export as influx_inspect writes it has one line per field: a series' fields one after another,
 * each a run of lines over the same times. The lines of one point are then a run apart, and the
 * merge after the read would sort every line to bring them together. So the reader joins them
 * where it meets them (`join_row`): a line of the series of the block it is in, of fields that block
 * has not had yet, at a time the block has a row for, puts its cells on that row instead of a row of
 * its own. A block is consecutive lines and nothing else reads between them, so the row still
 * stands for the block's lines in the order of the file; the caller gets the first line of each key
 * and kind from `key_first`, since a joined cell's row names an earlier line. A block's rows are one
 * per time, which `block_start` tells the merge: it need not look for a point twice inside one.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define JOIN_KEYS 64 /* field keys a line may have to join a row: those of a block are a bit mask */
#define MAX_KEY 65535 /* influxd's longest series key, and series key with a field name (plus 4) */

enum { KIND_FLOAT = 0, KIND_STRING = 1, KIND_INTEGER = 2, KIND_UNSIGNED = 3, KIND_BOOLEAN = 4 };

typedef struct {
    char *data;
    size_t len, cap;
} Buf;

static int buf_reserve(Buf *b, size_t more) {
    if (b->len + more <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more) cap *= 2;
    char *grown = realloc(b->data, cap);
    if (!grown) return -1;
    b->data = grown;
    b->cap = cap;
    return 0;
}

/* Room is reserved before the push: the per-line buffers for every line of the chunk, the cells by cells_grow. */
#define PUSH(buf, type, value)                                        \
    do {                                                              \
        *(type *)((buf).data + (buf).len) = (type)(value);            \
        (buf).len += sizeof(type);                                    \
    } while (0)

typedef struct {
    uint64_t hash;
    int64_t start; /* first occurrence in the chunk */
    int32_t len;
    int32_t id; /* -1: empty slot */
} Slot;

typedef struct {
    Slot *slots;
    size_t mask, count;
} Table;

/* The rows a block added for times its first run lacks, by time; slots of an older `gen` are empty. */
typedef struct {
    int64_t stamp, row;
    uint32_t gen;
} Extra;

#define ONES 0x0101010101010101ull
#define HIGHS 0x8080808080808080ull

/* How many bytes of [p, p + n) are `c`: sixteen at a time where the compiler has SSE2 (every x86-64),
 * else a byte at a time. The reading thread numbers each chunk's lines with it (`newlines`). */
static size_t count_byte(const char *p, size_t n, char c) {
    size_t count = 0, i = 0;
#ifdef __SSE2__
    const __m128i wanted = _mm_set1_epi8(c), zero = _mm_setzero_si128();
    while (i + 16 <= n) {
        __m128i sums = zero; /* per byte lane, at most 255 matches before they are added up */
        for (int round = 0; round < 255 && i + 16 <= n; round++, i += 16)
            sums = _mm_sub_epi8(sums, _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(p + i)), wanted));
        __m128i total = _mm_sad_epu8(sums, zero);
        count += (size_t)_mm_cvtsi128_si32(total) + (size_t)_mm_cvtsi128_si32(_mm_srli_si128(total, 8));
    }
#endif
    for (; i < n; i++) count += p[i] == c;
    return count;
}

/* A byte the plain lines never hold: a backslash, a carriage return, a control byte up to 3 (a masked
 * separator) or, to be checked as UTF-8, one of a multi-byte character. NUL counts too: it only makes
 * the lines of its chunk checked one by one. */
static inline int odd_byte(unsigned char c) { return c == '\\' || c == '\r' || c < 4 || c >= 0x80; }

/* The offset of every newline of [p, p + n), in order, into `ends` (grown as it fills); -1 out of
 * memory. One pass sixteen bytes at a time, where finding each line's end with memchr was a call per
 * line; it also counts the lines, so the chunk is not counted first, and finds whether the chunk has
 * a double quote and an odd byte (odd_byte), so that no other pass over it is needed. */
static int line_ends(Buf *ends, const char *p, size_t n, int *quotes, int *odd) {
    size_t count = 0, i = 0;
    int quoted = 0, strange = 0;
    ends->len = 0;
#ifdef __SSE2__
    const __m128i newline = _mm_set1_epi8('\n'), quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'),
                  cr = _mm_set1_epi8('\r'), four = _mm_set1_epi8(4);
    __m128i quotes_seen = _mm_setzero_si128(), odd_seen = _mm_setzero_si128();
    for (; i + 16 <= n; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(p + i));
        quotes_seen = _mm_or_si128(quotes_seen, _mm_cmpeq_epi8(v, quote));
        odd_seen = _mm_or_si128(odd_seen, _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, backslash), _mm_cmpeq_epi8(v, cr)),
                                                       _mm_cmplt_epi8(v, four))); /* signed: also every byte >= 0x80 */
        unsigned bits = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, newline));
        if (!bits) continue;
        ends->len = count * sizeof(int32_t);
        if (buf_reserve(ends, 16 * sizeof(int32_t))) return -1;
        int32_t *at = (int32_t *)ends->data;
        for (; bits; bits &= bits - 1) at[count++] = (int32_t)(i + (size_t)__builtin_ctz(bits));
    }
    quoted = _mm_movemask_epi8(quotes_seen) != 0, strange = _mm_movemask_epi8(odd_seen) != 0;
#endif
    for (; i < n; i++) {
        quoted |= p[i] == '"', strange |= odd_byte((unsigned char)p[i]);
        if (p[i] != '\n') continue;
        ends->len = count * sizeof(int32_t);
        if (buf_reserve(ends, sizeof(int32_t))) return -1;
        ((int32_t *)ends->data)[count++] = (int32_t)i;
    }
    ends->len = count * sizeof(int32_t);
    *quotes = quoted, *odd = strange;
    return 0;
}

static inline uint64_t zero_bytes(uint64_t x) { return (x - ONES) & ~x & HIGHS; } /* lowest flag exact */

static inline uint64_t mix(uint64_t h, uint64_t w) {
    h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    return h ^ (h >> 32);
}

/* The first space of [p, e) and the hash of the series before it, reading 8 bytes at a time (the
 * bytes past the space masked off, so equal series hash alike); NULL without a space, or with a
 * quote before it when `quotes`. Words are little-endian, as on the machines we build for. */
static const char *series_end(const char *p, const char *e, int quotes, uint64_t *hash) {
    uint64_t h = 0x9E3779B97F4A7C15ull;
    const char *q = p;
    while (e - q >= 8) {
        uint64_t w;
        memcpy(&w, q, 8);
        uint64_t found = zero_bytes(w ^ (ONES * ' ')) | (quotes ? zero_bytes(w ^ (ONES * '"')) : 0);
        if (found) {
            int k = __builtin_ctzll(found) / 8;
            q += k;
            if (*q != ' ') return NULL;
            if (k) h = mix(h, w & (~0ull >> (64 - 8 * k)));
            *hash = h ^ (uint64_t)(q - p) * 0xC4CEB9FE1A85EC53ull;
            return q;
        }
        h = mix(h, w);
        q += 8;
    }
    uint64_t w = 0;
    int n = 0;
    for (; q < e && *q != ' '; q++, n++) {
        if (quotes && *q == '"') return NULL;
        w |= (uint64_t)(unsigned char)*q << (8 * n);
    }
    if (q == e) return NULL;
    if (n) h = mix(h, w);
    *hash = h ^ (uint64_t)(q - p) * 0xC4CEB9FE1A85EC53ull;
    return q;
}

static int table_grow(Table *t) {
    size_t size = t->slots ? (t->mask + 1) * 2 : 1024;
    Slot *slots = malloc(size * sizeof(Slot));
    if (!slots) return -1;
    for (size_t i = 0; i < size; i++) slots[i].id = -1;
    if (t->slots) {
        for (size_t i = 0; i <= t->mask; i++) {
            if (t->slots[i].id < 0) continue;
            size_t j = t->slots[i].hash & (size - 1);
            while (slots[j].id >= 0) j = (j + 1) & (size - 1);
            slots[j] = t->slots[i];
        }
        free(t->slots);
    }
    t->slots = slots;
    t->mask = size - 1;
    return 0;
}

/* The number of the series text at `p`, a new one when first seen; -1 when out of memory. */
static int32_t table_id(Table *t, const char *base, const char *p, int32_t n, uint64_t h) {
    if ((t->count + 1) * 2 > t->mask + 1 && table_grow(t)) return -1;
    size_t j = h & t->mask;
    for (;;) {
        Slot *s = &t->slots[j];
        if (s->id < 0) {
            s->hash = h;
            s->start = p - base;
            s->len = n;
            s->id = (int32_t)t->count++;
            return s->id;
        }
        if (s->hash == h && s->len == n && memcmp(base + s->start, p, (size_t)n) == 0) return s->id;
        j = (j + 1) & t->mask;
    }
}

static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* A float spelled -?digits(.digits)?([eE][+-]?digits)?, within the doubles; 0 otherwise. Exact when the
 * digits fit 2^53 and the power of ten is at most 22 (both exact doubles, one rounding); else strtod,
 * which rounds correctly as well. */
static int parse_float(const char *p, const char *e, double *out) {
    const char *s = p;
    int negative = 0;
    if (p < e && *p == '-') negative = 1, p++;
    if (p == e || !is_digit(*p)) return 0;
    uint64_t mantissa = 0;
    int digits = 0, scale = 0;
    for (; p < e && is_digit(*p); p++) {
        if (digits < 19) mantissa = mantissa * 10 + (uint64_t)(*p - '0'), digits += mantissa > 0;
        else if (scale < 1000) scale++; /* past 80 characters strtod is not asked anyway */
    }
    if (p < e && *p == '.') {
        p++;
        if (p == e || !is_digit(*p)) return 0;
        for (; p < e && is_digit(*p); p++) {
            if (digits < 19) mantissa = mantissa * 10 + (uint64_t)(*p - '0'), digits += mantissa > 0, scale--;
        }
    }
    int exponent = 0;
    if (p < e && (*p == 'e' || *p == 'E')) {
        p++;
        int minus = 0;
        if (p < e && (*p == '+' || *p == '-')) minus = *p == '-', p++;
        if (p == e || !is_digit(*p)) return 0;
        for (; p < e && is_digit(*p); p++) {
            if (exponent < 100000) exponent = exponent * 10 + (*p - '0');
        }
        if (minus) exponent = -exponent;
    }
    if (p != e) return 0;
    int power = scale + exponent;
    if (digits < 19 && mantissa <= (1ull << 53) && power >= -22 && power <= 22) {
        double value = (double)mantissa;
        value = power < 0 ? value / POW10[-power] : value * POW10[power];
        *out = negative ? -value : value;
        return 1;
    }
    char text[80];
    size_t n = (size_t)(e - s);
    if (n >= sizeof text) return 0;
    memcpy(text, s, n);
    text[n] = 0;
    char *end;
    *out = strtod(text, &end);
    return end == text + n && isfinite(*out); /* influxd refuses a value beyond the largest double */
}

/* Whether 8 bytes are all ASCII digits, and their value: the SWAR forms of the fast_float library. */
static inline int eight_digits(uint64_t w) {
    return ((w & 0xF0F0F0F0F0F0F0F0ull) | (((w + 0x0606060606060606ull) & 0xF0F0F0F0F0F0F0F0ull) >> 4)) ==
           0x3333333333333333ull;
}

static inline uint32_t parse_eight(uint64_t w) {
    w -= 0x3030303030303030ull;
    w = (w * 10) + (w >> 8);
    w = (((w & 0x000000FF000000FFull) * 0x000F424000000064ull) +
         (((w >> 16) & 0x000000FF000000FFull) * 0x0000271000000001ull)) >> 32;
    return (uint32_t)w;
}

/* -?digits within int64 (the minus only when `sign`), or digits within uint64. */
static int parse_integer(const char *p, const char *e, int sign, uint64_t *out) {
    int negative = 0;
    if (sign && p < e && *p == '-') negative = 1, p++;
    if (p == e || e - p > 20) return 0;
    uint64_t value = 0;
    const char *safe = e - p > 19 ? e - 1 : e; /* 19 digits cannot overflow; the 20th is checked */
    for (uint64_t w; safe - p >= 8; p += 8) {
        memcpy(&w, p, 8);
        if (!eight_digits(w)) return 0;
        value = value * 100000000u + parse_eight(w);
    }
    for (; p < safe; p++) {
        if (!is_digit(*p)) return 0;
        value = value * 10 + (uint64_t)(*p - '0');
    }
    if (p < e) {
        if (!is_digit(*p) || value > (UINT64_MAX - (uint64_t)(*p - '0')) / 10) return 0;
        value = value * 10 + (uint64_t)(*p - '0');
    }
    if (sign) {
        if (negative ? value > (1ull << 63) : value > (uint64_t)INT64_MAX) return 0;
        *out = negative ? (uint64_t)0 - value : value;
    } else {
        *out = value;
    }
    return 1;
}

static int boolean(const char *p, size_t n, int *out) {
    static const char *truth[] = {"t", "T", "true", "True", "TRUE"};
    static const char *falsity[] = {"f", "F", "false", "False", "FALSE"};
    for (int i = 0; i < 5; i++) {
        if (strlen(truth[i]) == n && memcmp(truth[i], p, n) == 0) return *out = 1, 1;
        if (strlen(falsity[i]) == n && memcmp(falsity[i], p, n) == 0) return *out = 0, 1;
    }
    return 0;
}

static int utf8_valid(const unsigned char *p, const unsigned char *e) {
    while (p < e) {
        unsigned c = *p;
        if (c < 0x80) { p++; continue; }
        int n;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) n = 1, cp = c & 0x1F;
        else if (c >= 0xE0 && c <= 0xEF) n = 2, cp = c & 0x0F;
        else if (c >= 0xF0 && c <= 0xF4) n = 3, cp = c & 0x07;
        else return 0;
        if (e - p <= n) return 0;
        for (int i = 1; i <= n; i++) {
            if ((p[i] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (p[i] & 0x3F);
        }
        if ((n == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return 0;
        p += n + 1;
    }
    return 1;
}

/* A field key of the chunk: where it is first spelled, the last line that had it (a key given twice
 * in a line sets the line aside), its cells, the kinds it is spelled in and the line of each first. */
typedef struct {
    int64_t start, cells, first[5];
    int64_t line;
    uint64_t hash;
    int32_t len;
    uint8_t kinds;
} Key;

typedef struct {
    Buf odd, odd_start, rows, codes, stamps, cell_row, cell_key, cell_kind, cell_value;
    Buf by_row, by_kind, by_value; /* the cells again, grouped by key (in file order within a key) */
    Buf strings;
    Buf ends; /* the offset of each newline of the chunk */
    Buf block_start; /* a byte per row: 1 where a block (join_row) begins */
    size_t cell_room; /* cells the cell buffers have room for */
    Table series;
    Key *key;
    int32_t *key_slots; /* a hash table of key numbers, -1 empty */
    size_t key_mask;
    int32_t keys, key_room;
    int dialect; /* 1: InfluxDB 1.x, where `1u` is no value; 2: 2.x */
    int64_t lines;
    int join;                       /* whether lines may join an earlier row (join_row) */
    int64_t joined;                 /* lines that did */
    /* The block: rows [block_row, block_end) are its first run (block_end grows while first_run), of
     * one series and field set; `block_keys` the fields of all its runs, `run_keys` those of the run
     * being read, and `run_at` the row the next line of that run is looked for from. */
    int32_t block_code;
    int first_run;
    int64_t last_start; /* the series of the last line read, and its number */
    int32_t last_len, last_code;
    int64_t block_row, block_end, run_at, run_last;
    uint64_t block_keys, run_keys;
    Extra *extras;
    size_t extras_mask, extras_count;
    uint32_t gen;
} Out;

/* Room for twice the cells: the four cell buffers grow together. */
static int cells_grow(Out *o) {
    size_t cells = o->cell_room ? o->cell_room * 2 : 4096;
    Buf *bufs[] = {&o->cell_row, &o->cell_key, &o->cell_kind, &o->cell_value};
    size_t widths[] = {4, 4, 1, 8};
    for (size_t i = 0; i < 4; i++) {
        if (buf_reserve(bufs[i], cells * widths[i] - bufs[i]->len)) return -1;
    }
    o->cell_room = cells;
    return 0;
}

/* Field keys are short: compared in place, a call to memcmp per cell cost more than the comparing. */
static inline int same(const char *a, const char *b, int32_t n) {
    int32_t i = 0;
    for (uint64_t x, y; i + 8 <= n; i += 8) {
        memcpy(&x, a + i, 8), memcpy(&y, b + i, 8);
        if (x != y) return 0;
    }
    for (; i < n; i++) {
        if (a[i] != b[i]) return 0;
    }
    return 1;
}

static uint64_t key_hash(const char *p, int32_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    int32_t i = 0;
    for (uint64_t w; i + 8 <= n; i += 8) memcpy(&w, p + i, 8), h = mix(h, w);
    uint64_t w = 0;
    for (int k = 0; i < n; i++, k++) w |= (uint64_t)(unsigned char)p[i] << (8 * k);
    return mix(h, w);
}

/* Room for twice the keys, and their hash table rebuilt; -1 when out of memory. */
static int keys_grow(Out *o) {
    int32_t room = o->key_room ? o->key_room * 2 : 64;
    Key *grown = realloc(o->key, (size_t)room * sizeof(Key));
    if (!grown) return -1;
    o->key = grown, o->key_room = room;
    size_t size = (size_t)room * 2;
    int32_t *slots = malloc(size * sizeof(int32_t));
    if (!slots) return -1;
    for (size_t i = 0; i < size; i++) slots[i] = -1;
    for (int32_t k = 0; k < o->keys; k++) {
        size_t j = o->key[k].hash & (size - 1);
        while (slots[j] >= 0) j = (j + 1) & (size - 1);
        slots[j] = k;
    }
    free(o->key_slots);
    o->key_slots = slots, o->key_mask = size - 1;
    return 0;
}

/* The key's number in this chunk, a new one when first seen; -1 when out of memory. A line's fields
 * usually come in the order of the chunk's first line: the `guess`-th key is tried before the table. */
static int32_t key_id(Out *o, const char *base, const char *p, int32_t n, int32_t guess) {
    if (guess < o->keys && o->key[guess].len == n && same(base + o->key[guess].start, p, n)) return guess;
    uint64_t h = key_hash(p, n);
    if (o->keys) {
        for (size_t j = h & o->key_mask; o->key_slots[j] >= 0; j = (j + 1) & o->key_mask) {
            Key *k = &o->key[o->key_slots[j]];
            if (k->hash == h && k->len == n && same(base + k->start, p, n)) return o->key_slots[j];
        }
    }
    if (o->keys == o->key_room && keys_grow(o)) return -1;
    Key *k = &o->key[o->keys];
    memset(k, 0, sizeof *k);
    memset(k->first, 0xFF, sizeof k->first);
    k->start = p - base, k->len = n, k->hash = h, k->line = -1;
    size_t j = h & o->key_mask;
    while (o->key_slots[j] >= 0) j = (j + 1) & o->key_mask;
    o->key_slots[j] = o->keys;
    return o->keys++;
}

/* The block's row for `stamp` among those added for times its first run lacks; else `row` is
 * recorded as that row and -1 returned; -2 when out of memory. */
static int64_t extra_row(Out *o, int64_t stamp, int64_t row) {
    if ((o->extras_count + 1) * 2 > (o->extras ? o->extras_mask + 1 : 0)) {
        size_t size = o->extras ? (o->extras_mask + 1) * 2 : 256;
        Extra *grown = calloc(size, sizeof(Extra));
        if (!grown) return -2;
        for (size_t i = 0; o->extras && i <= o->extras_mask; i++) {
            if (o->extras[i].gen != o->gen) continue;
            size_t j = ((uint64_t)o->extras[i].stamp * 0x9E3779B97F4A7C15ull) >> 20 & (size - 1);
            while (grown[j].gen == o->gen) j = (j + 1) & (size - 1);
            grown[j] = o->extras[i];
        }
        free(o->extras);
        o->extras = grown, o->extras_mask = size - 1;
    }
    size_t j = ((uint64_t)stamp * 0x9E3779B97F4A7C15ull) >> 20 & o->extras_mask;
    for (; o->extras[j].gen == o->gen; j = (j + 1) & o->extras_mask) {
        if (o->extras[j].stamp == stamp) return o->extras[j].row;
    }
    o->extras[j] = (Extra){stamp, row, o->gen};
    o->extras_count++;
    return -1;
}

/* The row of its block that a line of series `code`, fields `keys` and time `stamp` joins, or the
 * line is a row of its own: -1 in the block (its first run goes on, or a time the first run lacks),
 * -2 the first of a new block; -3 out of memory. A later run's times must rise, as an export's do. */
static int64_t join_row(Out *o, int32_t code, uint64_t keys, int64_t stamp) {
    const int64_t *stamps = (const int64_t *)o->stamps.data;
    int64_t rows = (int64_t)(o->rows.len / sizeof(int32_t));
    if (o->join && code == o->block_code) {
        if (o->first_run && keys == o->run_keys && stamp > stamps[rows - 1]) return -1;
        if (o->first_run || keys != o->run_keys) { /* a run begins: of fields the block has not had */
            if (keys & o->block_keys) goto start;
            if (o->first_run) o->first_run = 0, o->block_end = rows;
            o->run_keys = keys, o->block_keys |= keys, o->run_at = o->block_row;
        } else if (stamp <= o->run_last) {
            goto start;
        }
        o->run_last = stamp;
        int64_t at = o->run_at; /* the first run's times rise: a field missing at some times skips them */
        while (at < o->block_end && stamps[at] < stamp) at++;
        o->run_at = at;
        if (at < o->block_end && stamps[at] == stamp) {
            o->run_at = at + 1;
            return at;
        }
        int64_t extra = extra_row(o, stamp, rows); /* a time the first run lacks: a row later runs may join */
        return extra == -2 ? -3 : extra;
    }
start:
    o->block_code = code, o->block_row = rows, o->first_run = 1, o->run_keys = o->block_keys = keys;
    o->gen++, o->extras_count = 0;
    return -2;
}

/* One line [p, e): its row and cells appended, 1; or 0 to set it aside (nothing appended); -1 out of memory. */
static int read_line(Out *o, const char *base, const char *p, const char *e, int careful, int quotes) {
    if (p == e) return 0;
    if (careful) {
        for (const char *c = p; c < e; c++) {
            if (*c == '\\' || *c == '\r' || (*c >= 1 && *c <= 3)) return 0;
        }
        if (!utf8_valid((const unsigned char *)p, (const unsigned char *)e)) return 0;
    }
    uint64_t hash = 0;
    int32_t code = -1, n = o->last_len; /* the previous line's series again (as in a run of an export): no hash */
    const char *space;
    if (n && e - p > n && p[n] == ' ' && same(p, base + o->last_start, n)) {
        space = p + n, code = o->last_code;
    } else {
        /* influxd skips spaces, tabs and NULs before a line, and reads nothing of a comment */
        if (*p == ' ' || *p == '\t' || *p == 0 || *p == '#') return 0;
        space = series_end(p, e, quotes, &hash);
        if (!space || space - p > MAX_KEY) return 0;
    }
    size_t cells = o->cell_kind.len;
    const char *q = space + 1;
    if (q < e && (*q == '\t' || *q == 0)) return 0; /* skipped before the fields, as a second space is */
    uint64_t seen = 0; /* the line's keys below JOIN_KEYS (the others are marked with the line in Key) */
    int joinable = 1;
    int32_t index = 0;
    int64_t row = (int64_t)(o->rows.len / sizeof(int32_t)), series_len = space - p;
    for (;;) {
        const char *k = q;
        while (q < e && *q != '=' && *q != ',' && *q != ' ' && *q != '"') q++;
        if (q == k || q == e || *q != '=') goto aside;
        if (series_len + 4 + (q - k) > MAX_KEY || (q - k == 4 && memcmp(k, "time", 4) == 0)) goto aside;
        int32_t key = key_id(o, base, k, (int32_t)(q - k), index++);
        if (key < 0) return -1;
        if (key < JOIN_KEYS) { /* given twice: the line's last value counts, or a conflict of two types */
            if (seen >> key & 1) goto aside;
            seen |= 1ull << key;
        } else {
            if (o->key[key].line == o->lines) goto aside;
            o->key[key].line = o->lines, joinable = 0;
        }
        const char *v = ++q;
        uint64_t value;
        int kind;
        if (v < e && *v == '"') {
            const char *close = memchr(v + 1, '"', (size_t)(e - v - 1));
            if (!close) goto aside;
            kind = KIND_STRING;
            value = (uint64_t)(v + 1 - base) | (uint64_t)(close - v - 1) << 32; /* offset, length: < 2^31 */
            q = close + 1;
            if (q == e || (*q != ',' && *q != ' ')) goto aside;
        } else {
            while (q < e && *q != ',' && *q != ' ' && *q != '"' && *q != '=') q++;
            if (q == v || q == e || (*q != ',' && *q != ' ')) goto aside;
            char last = q[-1];
            int truth;
            double real;
            if (last == 'i') {
                if (!parse_integer(v, q - 1, 1, &value)) goto aside;
                kind = KIND_INTEGER;
            } else if (last == 'u') {
                if (o->dialect < 2 || !parse_integer(v, q - 1, 0, &value)) goto aside;
                kind = KIND_UNSIGNED;
            } else if ((*v == 't' || *v == 'T' || *v == 'f' || *v == 'F') && boolean(v, (size_t)(q - v), &truth)) {
                kind = KIND_BOOLEAN;
                value = (uint64_t)truth;
            } else if (parse_float(v, q, &real)) {
                kind = KIND_FLOAT;
                memcpy(&value, &real, sizeof value);
            } else {
                goto aside;
            }
        }
        if (o->cell_kind.len == o->cell_room && cells_grow(o)) return -1;
        PUSH(o->cell_row, int32_t, row);
        PUSH(o->cell_key, int32_t, key);
        PUSH(o->cell_kind, uint8_t, kind);
        PUSH(o->cell_value, uint64_t, value);
        if (*q++ == ' ') break;
    }
    uint64_t stamp;
    if (!parse_integer(q, e, 1, &stamp)) goto aside;
    if (code < 0) {
        code = table_id(&o->series, base, p, (int32_t)(space - p), hash);
        if (code < 0) return -1;
        o->last_start = p - base, o->last_len = (int32_t)(space - p), o->last_code = code;
    }
    size_t last = o->cell_kind.len;
    for (size_t c = cells; c < last; c++) {
        int64_t *first = &o->key[((int32_t *)o->cell_key.data)[c]].first[((uint8_t *)o->cell_kind.data)[c]];
        if (*first < 0) *first = o->lines;
    }
    int64_t joins = joinable ? join_row(o, code, seen, (int64_t)stamp) : (o->block_code = -1, -2);
    if (joins >= 0) {
        for (size_t c = cells; c < last; c++) ((int32_t *)o->cell_row.data)[c] = (int32_t)joins;
        o->joined++;
        return 1;
    }
    if (joins == -3) return -1;
    PUSH(o->block_start, uint8_t, joins == -2);
    PUSH(o->rows, int32_t, o->lines);
    PUSH(o->codes, int32_t, code);
    PUSH(o->stamps, int64_t, stamp);
    return 1;
aside:
    o->cell_row.len = cells * sizeof(int32_t);
    o->cell_key.len = cells * sizeof(int32_t);
    o->cell_kind.len = cells;
    o->cell_value.len = cells * sizeof(uint64_t);
    return 0;
}

static int read_chunk(Out *o, const char *base, size_t size, int64_t most_odd) {
    const char *end = base + size;
    int quotes, careful; /* careful: an odd byte anywhere, so each line is checked for them and as UTF-8 */
    if (line_ends(&o->ends, base, size, &quotes, &careful)) return -1;
    const int32_t *ends = (const int32_t *)o->ends.data;
    size_t found = o->ends.len / sizeof(int32_t), next = 0;
    Buf *per_line[] = {&o->odd, &o->odd_start, &o->rows, &o->codes, &o->stamps, &o->block_start};
    for (size_t i = 0; i < 6; i++) {
        if (buf_reserve(per_line[i], (found + 1) * 8)) return -1;
    }
    for (const char *p = base; p < end; o->lines++) {
        const char *e = next < found ? base + ends[next++] : end;
        int got = read_line(o, base, p, e, careful, quotes);
        if (got < 0) return -1;
        if (!got) {
            o->block_code = -1; /* a line read elsewhere: no row may stand for lines on both sides of it */
            PUSH(o->odd, int32_t, o->lines);
            PUSH(o->odd_start, int32_t, p - base);
            if ((int64_t)(o->odd.len / sizeof(int32_t)) > most_odd) return 1;
        }
        p = e + 1;
    }
    return 0;
}

/* The cells grouped by key with a counting sort, so each key's values are one slice for the caller,
 * and the string values copied in that order into `strings`, their offsets now into it. */
static int group_cells(Out *o, const char *base) {
    size_t cells = o->cell_kind.len;
    const int32_t *key = (const int32_t *)o->cell_key.data;
    const uint8_t *kind = (const uint8_t *)o->cell_kind.data;
    const uint64_t *cell_value = (const uint64_t *)o->cell_value.data;
    size_t text = 0;
    for (size_t i = 0; i < cells; i++) {
        o->key[key[i]].cells++, o->key[key[i]].kinds |= (uint8_t)(1u << kind[i]);
        if (kind[i] == KIND_STRING) text += cell_value[i] >> 32;
    }
    int64_t *at = malloc(((size_t)o->keys + 1) * sizeof(int64_t)), total = 0;
    if (!at) return -1;
    for (int32_t k = 0; k < o->keys; k++) at[k] = total, total += o->key[k].cells;
    if (buf_reserve(&o->by_row, cells * 4) || buf_reserve(&o->by_kind, cells) || buf_reserve(&o->by_value, cells * 8) ||
        buf_reserve(&o->strings, text)) {
        free(at);
        return -1;
    }
    int32_t *row = (int32_t *)o->by_row.data;
    uint8_t *by_kind = (uint8_t *)o->by_kind.data;
    uint64_t *value = (uint64_t *)o->by_value.data;
    const int32_t *cell_row = (const int32_t *)o->cell_row.data;
    for (size_t i = 0; i < cells; i++) {
        int64_t j = at[key[i]]++;
        row[j] = cell_row[i], by_kind[j] = kind[i], value[j] = cell_value[i];
    }
    free(at);
    o->by_row.len = cells * 4, o->by_kind.len = cells, o->by_value.len = cells * 8;
    for (size_t j = 0; j < cells; j++) { /* in grouped order: a key's strings end to end, as Arrow keeps them */
        if (by_kind[j] != KIND_STRING) continue;
        size_t start = value[j] & 0xFFFFFFFFu, length = value[j] >> 32;
        if (length) memcpy(o->strings.data + o->strings.len, base + start, length); /* no buffer yet when all are "" */
        value[j] = (uint64_t)o->strings.len | (uint64_t)length << 32;
        o->strings.len += length;
    }
    return 0;
}

/* Each thread keeps its buffers for its next chunk: fresh ones cost a page fault every 4 KiB. */
#define BUFS 15
#define KEPT_BYTES (64u << 20)
static __thread Buf kept[BUFS];

static PyObject *as_bytes(Buf *b) { return PyBytes_FromStringAndSize(b->data ? b->data : "", (Py_ssize_t)b->len); }

/* The outputs are handed to Python as Blocks: the reader's own buffers behind the buffer protocol, so
 * numpy and Arrow take them without a copy. When the last array over a Block is gone its memory goes
 * back to a small pool, and a later chunk writes into it without the kernel zeroing fresh pages: the
 * copies and page faults were a sixth of the reader's time. The pool is touched only with the GIL. */
#define POOL_BUFFERS 24
#define POOL_BYTES (32u << 20) /* what two threads hand out per chunk, about; the rest is freed */
static Buf pool[POOL_BUFFERS];
static int pooled;
static size_t pooled_bytes;
static Buf pool_take(void) {
    Buf b = {0};
    if (pooled) b = pool[--pooled], pooled_bytes -= b.cap;
    b.len = 0;
    return b;
}
static void pool_give(Buf *b) {
    if (b->data && pooled < POOL_BUFFERS && pooled_bytes + b->cap <= POOL_BYTES) {
        pool[pooled++] = *b;
        pooled_bytes += b->cap;
    } else {
        free(b->data);
    }
    b->data = NULL, b->len = b->cap = 0;
}
typedef struct {
    PyObject_HEAD
    Buf buf;
} Block;

static int block_getbuffer(PyObject *self, Py_buffer *view, int flags) {
    static char empty;
    Block *block = (Block *)self;
    return PyBuffer_FillInfo(view, self, block->buf.data ? block->buf.data : &empty, (Py_ssize_t)block->buf.len, 1, flags);
}
static void block_dealloc(PyObject *self) {
    pool_give(&((Block *)self)->buf);
    Py_TYPE(self)->tp_free(self);
}

static PyBufferProcs block_buffer = {block_getbuffer, NULL};
static PyTypeObject BlockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "timelake.sources._lineproto.Block",
    .tp_doc = "Bytes the reader wrote, read-only, shared with the arrays over them.",
    .tp_basicsize = sizeof(Block),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = block_dealloc,
    .tp_as_buffer = &block_buffer,
};

/* A Block owning the buffer's memory (the buffer is left empty); NULL when out of memory. */
static PyObject *as_block(Buf *b) {
    Block *block = PyObject_New(Block, &BlockType);
    if (!block) return NULL;
    block->buf = *b;
    b->data = NULL, b->len = b->cap = 0;
    return (PyObject *)block;
}

static PyObject *split(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer chunk;
    long long most_odd;
    int join = 1, dialect = 1;
    if (!PyArg_ParseTuple(args, "y*L|pi", &chunk, &most_odd, &join, &dialect)) return NULL;
    if (chunk.len >= INT32_MAX) { /* offsets are 32-bit, as in Arrow's strings */
        PyBuffer_Release(&chunk);
        return Py_NewRef(Py_None);
    }
    Out o;
    memset(&o, 0, sizeof o);
    o.join = join, o.block_code = -1, o.gen = 1, o.dialect = dialect;
    Buf *bufs[] = {&o.odd, &o.rows, &o.codes, &o.stamps, &o.cell_row, &o.cell_key, &o.cell_kind, &o.cell_value,
                   &o.by_row, &o.by_kind, &o.by_value, &o.strings, &o.ends, &o.block_start, &o.odd_start};
    static const int handed[BUFS] = {1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 1, 1}; /* Blocks; the others stay with the thread */
    for (size_t i = 0; i < BUFS; i++) *bufs[i] = handed[i] ? pool_take() : kept[i], bufs[i]->len = 0;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = table_grow(&o.series) ? -1 : read_chunk(&o, chunk.buf, (size_t)chunk.len, most_odd);
    if (status == 0 && group_cells(&o, chunk.buf)) status = -1;
    Py_END_ALLOW_THREADS
    PyObject *result = NULL;
    if (status < 0) {
        PyErr_NoMemory();
    } else if (status > 0) {
        result = Py_NewRef(Py_None);
    } else {
        Buf series = {0}, offsets = {0};
        int ok = 1;
        {
            int64_t total = 0;
            int32_t *lengths = malloc((o.series.count + 1) * sizeof(int32_t));
            int64_t *where = malloc((o.series.count + 1) * sizeof(int64_t));
            ok = lengths && where;
            for (size_t i = 0; ok && i <= o.series.mask; i++) {
                Slot *s = &o.series.slots[i];
                if (s->id >= 0) lengths[s->id] = s->len, where[s->id] = s->start;
            }
            for (size_t i = 0; ok && i < o.series.count; i++) {
                ok = !buf_reserve(&offsets, 4) && !buf_reserve(&series, (size_t)lengths[i]);
                if (!ok) break;
                *(int32_t *)(offsets.data + offsets.len) = (int32_t)total;
                offsets.len += 4;
                memcpy(series.data + series.len, (const char *)chunk.buf + where[i], (size_t)lengths[i]);
                series.len += (size_t)lengths[i];
                total += lengths[i];
            }
            if (ok && !buf_reserve(&offsets, 4)) {
                *(int32_t *)(offsets.data + offsets.len) = (int32_t)total;
                offsets.len += 4;
            } else {
                ok = 0;
            }
            free(lengths);
            free(where);
        }
        Buf counts = {0}, kinds = {0}, firsts = {0};
        ok = ok && !buf_reserve(&counts, (size_t)o.keys * 8 + 1) && !buf_reserve(&kinds, (size_t)o.keys + 1) &&
             !buf_reserve(&firsts, (size_t)o.keys * 40 + 1);
        PyObject *names = ok ? PyList_New(o.keys) : NULL;
        for (int32_t k = 0; names && k < o.keys; k++) {
            PUSH(counts, int64_t, o.key[k].cells);
            PUSH(kinds, uint8_t, o.key[k].kinds);
            memcpy(firsts.data + firsts.len, o.key[k].first, 40), firsts.len += 40;
            PyObject *name = PyUnicode_DecodeUTF8((const char *)chunk.buf + o.key[k].start, o.key[k].len, "strict");
            if (!name) Py_CLEAR(names);
            else PyList_SET_ITEM(names, k, name);
        }
        if (!ok) {
            Py_XDECREF(names);
            PyErr_NoMemory();
        } else if (names) {
            result = Py_BuildValue("(LNNNNNNNNNNNNNNLNN)", (long long)o.lines, as_block(&o.odd), as_block(&o.rows),
                                   as_block(&o.codes), as_block(&o.stamps), as_bytes(&offsets), as_bytes(&series), names,
                                   as_bytes(&counts), as_bytes(&kinds), as_block(&o.by_row), as_block(&o.by_kind),
                                   as_block(&o.by_value), as_block(&o.strings), as_bytes(&firsts), (long long)o.joined,
                                   as_block(&o.block_start), as_block(&o.odd_start));
        }
        free(counts.data), free(kinds.data), free(firsts.data);
        free(series.data);
        free(offsets.data);
    }
    for (size_t i = 0; i < BUFS; i++) {
        if (handed[i]) { /* not handed over: a chunk given up, or out of memory */
            pool_give(bufs[i]);
            continue;
        }
        if (bufs[i]->cap > KEPT_BYTES) free(bufs[i]->data), bufs[i]->data = NULL, bufs[i]->cap = 0;
        kept[i] = *bufs[i];
    }
    free(o.series.slots);
    free(o.extras);
    free(o.key);
    free(o.key_slots);
    PyBuffer_Release(&chunk);
    return result;
}

static PyObject *newlines(PyObject *Py_UNUSED(self), PyObject *arg) {
    Py_buffer chunk;
    if (PyObject_GetBuffer(arg, &chunk, PyBUF_SIMPLE) < 0) return NULL;
    size_t count;
    Py_BEGIN_ALLOW_THREADS
    count = count_byte(chunk.buf, (size_t)chunk.len, '\n');
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&chunk);
    return PyLong_FromSize_t(count);
}

/* Where the lines at the end of [0, end) of the last line's series begin, when that is in the second
 * half; else `end`. `end` follows a newline. A chunk cut there leaves a series' run of lines whole to
 * the next chunk, where its lines of one point are joined (join_row); a longer run is cut anyway.
 * line_protocol._series_tail does the same without this module. */
static PyObject *series_tail(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer chunk;
    Py_ssize_t end;
    if (!PyArg_ParseTuple(args, "y*n", &chunk, &end)) return NULL;
    const char *base = chunk.buf;
    Py_ssize_t cut = end;
    if (end > 1 && end <= chunk.len && base[end - 1] == '\n') {
        Py_ssize_t start = end - 1;
        while (start > 0 && base[start - 1] != '\n') start--;
        const char *space = memchr(base + start, ' ', (size_t)(end - 1 - start));
        size_t n = space ? (size_t)(space - base - start) + 1 : 0; /* the series and its space */
        while (n && start > end / 2) {
            Py_ssize_t before = start - 1;
            while (before > 0 && base[before - 1] != '\n') before--;
            if ((size_t)(start - 1 - before) <= n || memcmp(base + before, base + start, n) != 0) {
                cut = start;
                break;
            }
            start = before;
        }
    }
    PyBuffer_Release(&chunk);
    return PyLong_FromSsize_t(cut);
}

static PyMethodDef methods[] = {
    {"series_tail", series_tail, METH_VARARGS,
     "series_tail(chunk, end) -> where the lines of the last line's series begin, if in the second half; else end"},
    {"newlines", newlines, METH_O, "newlines(chunk) -> how many newline bytes the chunk holds"},
    {"split", split, METH_VARARGS,
     "split(chunk, most_odd, join=True, dialect=1) -> None when more than most_odd lines are set aside, else (lines, "
     "odd, rows, codes, stamps, series_offsets, series_data, keys, key_cells, key_kinds, cell_row, cell_kind, "
     "cell_value, strings, key_first, joined, block_start, odd_start); with join, a line of a field that the point's "
     "row lacks joins that row; dialect 2 (InfluxDB 2.x) reads unsigned integers"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lineproto", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__lineproto(void) {
    if (PyType_Ready(&BlockType) < 0) return NULL;
    return PyModule_Create(&module);
}
