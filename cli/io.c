/*
 * io.c - how every `kvx` command reads its inputs and writes its outputs
 * (DESIGN.md, trust rule 5: bounded by the input; the named output only).
 *
 * Inputs. An envelope is read to exactly the length its 28-byte header
 * declares (28 + n*(12+P) + 4), whatever it comes from: a regular file
 * must be that long, a pipe, FIFO or device is read that far and no
 * further; the header is refused at its first bad field, and no declared
 * length above the cap (4 GiB, KVX_CLI_ENVELOPE_CAP may lower it) is
 * read. Token text stops at the cap (1 GiB, KVX_CLI_TEXT_CAP) or at the
 * first byte that cannot be part of token ids. A shard must be a regular
 * file: anything else is refused by type before it is opened.
 *
 * Outputs. The named output is replaced only when it is a regular file
 * (or absent): the bytes go to an unnamed O_TMPFILE in its directory,
 * which is fsynced, linked as ".kvx-tmp.<pid>.<16 hex digits: the
 * name's hash and 64 random bits>" and renamed over the target at once,
 * so a killed command leaves nothing (a named temporary only where
 * O_TMPFILE is missing; any such file whose pid is dead and which is 10
 * minutes old is removed by the next command writing into that
 * directory). The temporary's name has a fixed length whatever the
 * target's, so any name the file system takes can be written (one of 250
 * bytes plus a suffix could not). A FIFO or a character device is written
 * into directly, never renamed over (a FIFO without a reader is refused
 * at once); a symlink, a directory, a block device or a socket is refused
 * and left as it is. "-" is standard output.
 *
 * A replaced file keeps its permission bits: the temporary takes them
 * before any byte is written to it (or, for a shard the library writes,
 * before the rename).
 */
#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ caps */

static uint64_t env_cap(const char *name, uint64_t dflt)
{
    const char *s = getenv(name);
    uint64_t v;
    /* Only lowers the cap: a test makes it small, nothing makes it larger. */
    if (s && *s && cli_parse_size(s, &v) == 0 && v > 0 && v < dflt) return v;
    return dflt;
}

uint64_t cli_envelope_cap(void) { return env_cap("KVX_CLI_ENVELOPE_CAP", CLI_ENVELOPE_CAP); }
uint64_t cli_text_cap(void) { return env_cap("KVX_CLI_TEXT_CAP", CLI_TEXT_CAP); }

const char *cli_file_type(unsigned mode)
{
    switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFIFO: return "a FIFO (named pipe)";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFSOCK: return "a socket";
    case S_IFLNK: return "a symbolic link";
    default: return "not a regular file";
    }
}

/* "cannot open 'path': No such file or directory (ENOENT)" and its hint. */
static int fail_open(const cli_cmd *c, const char *path, int e)
{
    cli_fail(c, "cannot open '%s': %s (%s)", path, strerror(e), kvx_err_name(-e));
    const char *hint = cli_hint(-e);
    if (*hint) fprintf(stderr, "  hint: %s\n", hint);
    return CLI_FAIL;
}

int cli_require_regular(const cli_cmd *c, const char *path, const char *what)
{
    struct stat st;
    if (stat(path, &st) != 0) return fail_open(c, path, errno);
    if (!S_ISREG(st.st_mode))
        return cli_fail(c, "'%s' is %s, not a regular file: %s must be a regular file", path,
                        cli_file_type(st.st_mode), what);
    return CLI_OK;
}

/* -------------------------------------------------------------- reading */

/* Reads up to n bytes; fewer only at end of input. Returns the count or
 * -errno. */
static ssize_t read_full(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -errno;
        if (r == 0) break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

/* Opens an input: "-" is standard input (not closed later). Never blocks:
 * a FIFO is opened O_NONBLOCK (a FIFO no process writes to reads as
 * empty), then switched back to blocking reads. A directory, a socket or
 * a block device is refused by type, and a character device (by name)
 * unless devices is set. */
static int open_input_as(const cli_cmd *c, const char *path, int devices, int *out_fd,
                         struct stat *st)
{
    int fd;
    if (!strcmp(path, "-")) {
        fd = STDIN_FILENO;
    } else {
        if (stat(path, st) != 0) return fail_open(c, path, errno);
        if (!S_ISREG(st->st_mode) && !S_ISFIFO(st->st_mode) && !(devices && S_ISCHR(st->st_mode)))
            return cli_fail(c, "'%s' is %s: give a file, a FIFO or '-' (standard input)", path,
                            cli_file_type(st->st_mode));
        fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        if (fd < 0) return fail_open(c, path, errno);
        int fl = fcntl(fd, F_GETFL);
        if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    }
    if (fstat(fd, st) != 0) {
        int e = errno;
        if (fd != STDIN_FILENO) close(fd);
        return cli_fail(c, "cannot read '%s': %s", path, strerror(e));
    }
    if (S_ISDIR(st->st_mode) || S_ISSOCK(st->st_mode) || S_ISBLK(st->st_mode)) {
        if (fd != STDIN_FILENO) close(fd);
        return cli_fail(c, "'%s' is %s: give a file, a FIFO or '-' (standard input)", path,
                        cli_file_type(st->st_mode));
    }
    if (!devices && fd != STDIN_FILENO && !S_ISREG(st->st_mode) && !S_ISFIFO(st->st_mode)) {
        close(fd); /* another file took the name meanwhile */
        return cli_fail(c, "'%s' is %s: give a file, a FIFO or '-' (standard input)", path,
                        cli_file_type(st->st_mode));
    }
    *out_fd = fd;
    return CLI_OK;
}

static int open_input(const cli_cmd *c, const char *path, int *out_fd, struct stat *st)
{
    return open_input_as(c, path, 1, out_fd, st);
}

int cli_open_input(const cli_cmd *c, const char *path, int *out_fd)
{
    struct stat st;
    return open_input_as(c, path, 0, out_fd, &st);
}

const char *cli_empty_why(const char *path)
{
    struct stat st;
    if (path && strcmp(path, "-") && stat(path, &st) == 0 && S_ISFIFO(st.st_mode))
        return " (a FIFO gives nothing until a process opens it for writing, and kvx does not wait: start the "
               "writer first)";
    return "";
}

static void close_input(int fd)
{
    if (fd != STDIN_FILENO) close(fd);
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Checks a 28-byte envelope header field by field (the order of
 * kvx_envelope_parse) and gives the whole length it declares. Prints the
 * first bad field and returns CLI_FAIL. */
static int envelope_header(const cli_cmd *c, const char *name, const uint8_t *h, uint64_t cap,
                           size_t *out_total)
{
    if (memcmp(h, "TLKV", 4) != 0)
        return cli_fail(c, "'%s' is not a TLKV envelope (bad magic)", name);
    uint16_t version = (uint16_t)(h[4] | h[5] << 8), dtype = (uint16_t)(h[6] | h[7] << 8);
    if (version != KVX_ENVELOPE_V1 && version != KVX_ENVELOPE_V2 && version != KVX_ENVELOPE_V3) {
        cli_fail(c, "'%s': envelope version %u is not one this kvx reads (1, 2 or 3)", name, version);
        fprintf(stderr, "  hint: %s\n", cli_hint(KVX_EVERSION));
        return CLI_FAIL;
    }
    const unsigned want_dtype = version == KVX_ENVELOPE_V1 ? 1u : version == KVX_ENVELOPE_V2 ? 3u : 2u;
    if (dtype != want_dtype)
        return cli_fail(c, "'%s': dtype %u is not the dtype of a v%u envelope (%u)", name, dtype,
                        version, want_dtype);
    uint32_t n = le32(h + 8);
    kvx_geometry g;
    memset(&g, 0, sizeof g);
    g.block_tokens = le32(h + 12);
    g.num_layers = le32(h + 16);
    g.kv_heads = le32(h + 20);
    g.head_dim = le32(h + 24);
    g.quant = version == KVX_ENVELOPE_V1 ? KVX_QUANT_FP16 : version == KVX_ENVELOPE_V2 ? KVX_QUANT_E4M3 : KVX_QUANT_BF16;
    const char *zero = !g.block_tokens ? "block_tokens" : !g.num_layers ? "n_layers"
                     : !g.kv_heads ? "n_kv_heads" : !g.head_dim ? "head_dim" : NULL;
    if (zero) return cli_fail(c, "'%s': the envelope header's %s is 0", name, zero);
    size_t total = 0;
    if (kvx_envelope_payload_bytes(version, &g) == 0 ||
        kvx_envelope_size(&total, version, &g, n) != 0)
        return cli_fail(c, "'%s': the envelope header declares a size that overflows "
                           "(n=%u B=%u L=%u Hkv=%u D=%u)", name, n, g.block_tokens,
                        g.num_layers, g.kv_heads, g.head_dim);
    if ((uint64_t)total > cap) {
        char a[32], b[32];
        return cli_fail(c, "'%s': the envelope header declares %s (%zu bytes), above the input "
                           "limit of %s", name, cli_fmt_size(a, sizeof a, total), total,
                        cli_fmt_size(b, sizeof b, cap));
    }
    *out_total = total;
    return CLI_OK;
}

int cli_read_envelope_fd(const cli_cmd *c, const char *name, int fd, int regular, uint64_t size,
                         const uint8_t *head, size_t head_len, void **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    uint8_t h[KVX_ENVELOPE_HEADER_BYTES];
    size_t have = head_len < sizeof h ? head_len : sizeof h;
    if (have) memcpy(h, head, have);
    if (have < sizeof h) {
        ssize_t r = read_full(fd, h + have, sizeof h - have);
        if (r < 0) return cli_fail(c, "cannot read '%s': %s", name, strerror((int)-r));
        have += (size_t)r;
    }
    if (have < sizeof h) {
        if (have >= 4 && memcmp(h, "TLKV", 4) != 0)
            return cli_fail(c, "'%s' is not a TLKV envelope (bad magic)", name);
        return cli_fail(c, "'%s' is %zu bytes, shorter than an envelope's 32%s", name, have,
                        have ? "" : cli_empty_why(name));
    }
    size_t total = 0;
    if (envelope_header(c, name, h, cli_envelope_cap(), &total) != CLI_OK) return CLI_FAIL;
    if (regular && size != total)
        return cli_fail(c, "'%s' is %" PRIu64 " bytes but its envelope header declares %zu "
                           "(28 + n*(12+P) + 4): truncated or not one envelope", name, size, total);
    /* Grown as the bytes arrive, never past total: a header that promises
     * much and a stream that ends early cost only what came. */
    size_t cap = total < ((size_t)1 << 20) ? total : (size_t)1 << 20;
    uint8_t *buf = malloc(cap);
    if (!buf) return cli_fail(c, "out of memory");
    memcpy(buf, h, sizeof h);
    size_t got = sizeof h;
    if (head_len > sizeof h) {
        size_t extra = head_len - sizeof h;
        if (extra > total - got) extra = total - got;
        memcpy(buf + got, head + sizeof h, extra);
        got += extra;
    }
    while (got < total) {
        if (got == cap) {
            size_t nc = cap > total / 2 ? total : cap * 2;
            uint8_t *nb = realloc(buf, nc);
            if (!nb) {
                free(buf);
                return cli_fail(c, "out of memory reading '%s' (%zu bytes)", name, total);
            }
            buf = nb;
            cap = nc;
        }
        ssize_t r = read(fd, buf + got, cap - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            free(buf);
            return cli_fail(c, "cannot read '%s': %s", name, strerror(e));
        }
        if (r == 0) {
            free(buf);
            return cli_fail(c, "'%s' ended after %zu of the %zu bytes its envelope header "
                               "declares", name, got, total);
        }
        got += (size_t)r;
    }
    *out = buf;
    *out_len = total;
    return CLI_OK;
}

int cli_read_envelope(const cli_cmd *c, const char *path, void **out, size_t *out_len)
{
    int fd;
    struct stat st;
    if (open_input(c, path, &fd, &st) != CLI_OK) return CLI_FAIL;
    const char *name = strcmp(path, "-") ? path : "standard input";
    int rc = cli_read_envelope_fd(c, name, fd, S_ISREG(st.st_mode), (uint64_t)st.st_size, NULL, 0,
                                  out, out_len);
    close_input(fd);
    return rc;
}

int cli_read_input_head(const cli_cmd *c, const char *path, int *out_fd, int *out_regular,
                        uint64_t *out_size, uint8_t *head, size_t want, size_t *got)
{
    struct stat st;
    if (open_input(c, path, out_fd, &st) != CLI_OK) return CLI_FAIL;
    ssize_t r = read_full(*out_fd, head, want);
    if (r < 0) {
        close_input(*out_fd);
        return cli_fail(c, "cannot read '%s': %s", path, strerror((int)-r));
    }
    *got = (size_t)r;
    *out_regular = S_ISREG(st.st_mode);
    *out_size = (uint64_t)st.st_size;
    return CLI_OK;
}

void cli_close_input(int fd) { close_input(fd); }

/* A byte that may appear in token text: digits, hex digits and 'x' of
 * 0x, and the separators cli_parse_tokens skips. */
static int token_byte(unsigned char ch)
{
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F') ||
           ch == 'x' || ch == 'X' || ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' ||
           ch == ',';
}

int cli_read_tokens_fd(const cli_cmd *c, const char *name, int fd, int bad_rc, uint32_t **out,
                       size_t *out_n)
{
    *out = NULL;
    *out_n = 0;
    uint64_t limit = cli_text_cap();
    size_t cap = limit < ((uint64_t)1 << 16) ? (size_t)limit : (size_t)1 << 16, len = 0;
    char *text = malloc(cap + 1);
    if (!text) return cli_fail(c, "out of memory");
    int stop = 0;
    while (!stop) {
        if (len == cap) {
            if ((uint64_t)len >= limit) {
                /* Exactly the limit is taken: only a byte past it is too
                 * much (a text of exactly 1 GiB was refused). */
                char extra;
                ssize_t r = read(fd, &extra, 1);
                if (r < 0 && errno == EINTR) continue;
                if (r == 0) break;
                int e = errno;
                free(text);
                if (r < 0) return cli_fail(c, "cannot read '%s': %s", name, strerror(e));
                char a[32];
                return cli_fail(c, "'%s' holds more than %s of token text (the input limit)",
                                name, cli_fmt_size(a, sizeof a, limit));
            }
            size_t nc = (uint64_t)cap * 2 > limit ? (size_t)limit : cap * 2;
            char *nt = realloc(text, nc + 1);
            if (!nt) {
                free(text);
                return cli_fail(c, "out of memory");
            }
            text = nt;
            cap = nc;
        }
        ssize_t r = read(fd, text + len, cap - len);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            free(text);
            return cli_fail(c, "cannot read '%s': %s", name, strerror(e));
        }
        if (r == 0) break;
        /* A byte no token text holds ends the reading: the parse below
         * names the word (endless binary input stops here, not at the cap). */
        for (size_t i = len; i < len + (size_t)r; i++)
            if (!token_byte((unsigned char)text[i])) stop = 1;
        len += (size_t)r;
    }
    text[len] = '\0';
    int rc = CLI_OK;
    if (memchr(text, '\0', len)) {
        rc = bad_rc;
        cli_fail(c, "'%s' holds a NUL byte: it is not whitespace-separated token ids", name);
        if (bad_rc == CLI_USAGE) fprintf(stderr, "Try 'kvx %s --help' for usage.\n", c->name);
    } else {
        const char *bad = NULL;
        if (cli_parse_tokens(out, out_n, text, &bad) != 0) {
            if (bad) {
                rc = bad_rc;
                cli_fail(c, "'%s' holds '%.20s', which is not a token id (0..%u)", name, bad,
                         UINT32_MAX);
                if (bad_rc == CLI_USAGE) fprintf(stderr, "Try 'kvx %s --help' for usage.\n", c->name);
            } else {
                rc = cli_fail(c, "out of memory");
            }
        }
    }
    free(text);
    return rc;
}

int cli_read_tokens(const cli_cmd *c, const char *path, uint32_t **out, size_t *out_n)
{
    int fd;
    struct stat st;
    if (open_input(c, path, &fd, &st) != CLI_OK) return CLI_FAIL;
    int rc = cli_read_tokens_fd(c, strcmp(path, "-") ? path : "standard input", fd, CLI_FAIL, out,
                                out_n);
    close_input(fd);
    return rc;
}

/* -------------------------------------------------------------- writing */

#define TMP_MARK ".kvx-tmp."

/* 1 when p starts with "." and 16 lowercase hex digits. */
static int dot_hex16(const char *p)
{
    if (*p != '.') return 0;
    for (int i = 1; i <= 16; i++)
        if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f'))) return 0;
    return 1;
}

/* Removes the temporary files of dead kvx commands from dirfd: names
 * ".kvx-tmp.<pid>.<hex>" (and ".<name>.kvx-tmp.<pid>", which kvx wrote
 * before its temporaries had a fixed length), and the shard writer's own
 * temporary of such a name (".<that>.tmp.<pid>.<hex>"), whose <pid> no
 * longer runs and which nobody has written for STALE_TMP_AGE_S: a kvx in
 * another PID namespace (a sibling container on a shared volume) or on
 * another host (NFS) is "no such process" here while it writes. */
#define STALE_TMP_AGE_S 600
static void clean_stale(int dirfd)
{
    int dfd = dup(dirfd);
    if (dfd < 0) return;
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return;
    }
    uid_t me = geteuid();
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *nm = de->d_name;
        if (nm[0] != '.') continue;
        const char *m = strstr(nm, TMP_MARK);
        if (!m) continue;
        const char *p = m + strlen(TMP_MARK);
        if (*p < '1' || *p > '9') continue;
        char *end;
        errno = 0;
        long pid = strtol(p, &end, 10);
        if (errno || pid <= 0 || pid > 0x3fffffff) continue;
        if (dot_hex16(end)) end += 17;
        if (*end && strncmp(end, ".tmp.", 5) != 0) continue;
        if (pid != (long)getpid() && (kill((pid_t)pid, 0) == 0 || errno != ESRCH)) continue;
        struct stat st;
        if (fstatat(dirfd, nm, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
            st.st_uid != me)
            continue;
        /* our own pid too: a sibling container's kvx often has the same
         * one (PID 1 as its entrypoint) */
        if (time(NULL) - st.st_mtime < STALE_TMP_AGE_S) continue;
        unlinkat(dirfd, nm, 0);
    }
    closedir(d);
}

#define TMPNAME_CAP 64

static int set_names(cli_out *o, const char *path)
{
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t dl = slash ? (size_t)(slash - path) : 1;
    o->dir = malloc(dl + 1);
    o->base = strdup(base);
    o->tmpname = malloc(TMPNAME_CAP);
    if (!o->dir || !o->base || !o->tmpname) return -ENOMEM;
    if (slash) {
        memcpy(o->dir, path, dl);
        o->dir[dl] = '\0';
        if (dl == 0) strcpy(o->dir, "/");
    } else {
        strcpy(o->dir, ".");
    }
    /* A fixed length (at most 36 bytes, and the shard writer's temporary
     * of it at most 69): the target's name, up to the file system's 255
     * bytes, is not part of it, only its FNV-1a hash, so two outputs of
     * one process in one directory still differ; mixed with 64 random
     * bits, so a kvx of the same pid in another PID namespace (a sibling
     * container on a shared volume) never has our temporary's name. */
    uint64_t h = 0xcbf29ce484222325ull, r = 0;
    for (const unsigned char *p = (const unsigned char *)base; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) == (ssize_t)sizeof r) h ^= r;
    snprintf(o->tmpname, TMPNAME_CAP, TMP_MARK "%ld.%016llx", (long)getpid(), (unsigned long long)h);
    return 0;
}

static char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

void cli_out_abort(cli_out *o)
{
    if (o->fd >= 0 && !o->is_stdout) close(o->fd);
    if (o->named && o->dirfd >= 0) unlinkat(o->dirfd, o->tmpname, 0);
    if (o->lib_path) unlink(o->lib_path); /* the library's file, or nothing */
    if (o->dirfd >= 0) close(o->dirfd);
    free(o->dir);
    free(o->base);
    free(o->tmpname);
    free(o->lib_path);
    memset(o, 0, sizeof *o);
    o->fd = o->dirfd = -1;
}

/* Opens the target itself: a FIFO (refused at once without a reader) or a
 * character device. */
static int open_direct(const cli_cmd *c, cli_out *o, const char *path, const struct stat *st)
{
    int fd = open(path, O_WRONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (e == ENXIO && S_ISFIFO(st->st_mode))
            return cli_fail(c, "cannot write '%s': no process is reading that FIFO", path);
        return cli_fail(c, "cannot write '%s': %s", path, strerror(e));
    }
    struct stat now;
    if (fstat(fd, &now) != 0 || (now.st_mode & S_IFMT) != (st->st_mode & S_IFMT) ||
        now.st_ino != st->st_ino) {
        close(fd);
        return cli_fail(c, "cannot write '%s': it changed while being opened", path);
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    signal(SIGPIPE, SIG_IGN); /* a reader that goes away is an error, not a kill */
    o->fd = fd;
    o->direct = 1;
    return CLI_OK;
}

/* An output inside a store directory (any store's, not only the one a
 * command reads) would replace a file that store owns: a sealed shard,
 * STORE, the index. Walks up from the output's directory looking for a
 * STORE file; 1 (and the message) when one is found. */
static int lands_in_store(const cli_cmd *c, const char *path)
{
    char parent[PATH_MAX], real[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(parent, sizeof parent, ".");
    else if (slash == path) snprintf(parent, sizeof parent, "/");
    else if ((size_t)(slash - path) >= sizeof parent) return 0; /* the open reports it */
    else snprintf(parent, sizeof parent, "%.*s", (int)(slash - path), path);
    if (!realpath(parent, real)) return 0; /* the output's own checks report it */
    for (;;) {
        char marker[PATH_MAX + 8];
        struct stat st;
        snprintf(marker, sizeof marker, "%s/STORE", strcmp(real, "/") ? real : "");
        if (lstat(marker, &st) == 0 && S_ISREG(st.st_mode)) {
            cli_fail(c, "'%s' lies inside the store '%s': an output never replaces a store's own files", path,
                     real);
            return 1;
        }
        if (!strcmp(real, "/")) return 0;
        char *cut = strrchr(real, '/');
        if (cut == real) cut[1] = 0;
        else *cut = 0;
    }
}

int cli_out_open(const cli_cmd *c, cli_out *o, const char *path, int for_library)
{
    memset(o, 0, sizeof *o);
    o->fd = o->dirfd = -1;
    o->path = path;
    if (!strcmp(path, "-")) {
        if (for_library)
            return cli_fail(c, "'-' (standard output) cannot take a shard here; name a file");
        signal(SIGPIPE, SIG_IGN);
        o->fd = STDOUT_FILENO;
        o->is_stdout = o->direct = 1;
        return CLI_OK;
    }
    if (lands_in_store(c, path)) return CLI_FAIL;
    struct stat st;
    int exists = lstat(path, &st) == 0;
    if (!exists && errno != ENOENT) return cli_fail(c, "cannot write '%s': %s", path, strerror(errno));
    if (exists) {
        if (S_ISLNK(st.st_mode)) {
            cli_fail(c, "'%s' is a symbolic link: kvx neither follows nor replaces one", path);
            fprintf(stderr, "  hint: name the file itself, or remove the link first%s\n",
                    !strncmp(path, "/dev/std", 8) ? " ('-o -' writes to standard output)" : "");
            return CLI_FAIL;
        }
        if (S_ISDIR(st.st_mode))
            return cli_fail(c, "'%s' is a directory: name the file to write", path);
        if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) {
            if (open_direct(c, o, path, &st) != CLI_OK) return CLI_FAIL;
            if (for_library) {
                /* The library writes a file: it goes beside, in TMPDIR,
                 * and is copied in at commit. */
                const char *t = getenv("TMPDIR");
                if (!t || !*t) t = "/tmp";
                o->dirfd = open(t, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                char nm[64];
                uint64_t r = 0;
                if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) r = 0;
                snprintf(nm, sizeof nm, ".kvx-out" TMP_MARK "%ld.%016llx", (long)getpid(), (unsigned long long)r);
                if (o->dirfd < 0 || !(o->lib_path = join(t, nm))) {
                    int e = errno;
                    cli_out_abort(o);
                    return cli_fail(c, "cannot use the temporary directory '%s': %s", t, strerror(e));
                }
                clean_stale(o->dirfd);
                unlinkat(o->dirfd, nm, 0); /* never another's: 64 random bits in the name */
            }
            return CLI_OK;
        }
        if (!S_ISREG(st.st_mode))
            return cli_fail(c, "'%s' is %s: kvx writes only regular files, FIFOs and character "
                               "devices", path, cli_file_type(st.st_mode));
        o->keep_mode = 1; /* the replacement keeps the permission bits */
        o->mode = st.st_mode & 0777;
    }
    if (set_names(o, path) != 0) {
        cli_out_abort(o);
        return cli_fail(c, "out of memory");
    }
    if (!o->base[0] || !strcmp(o->base, ".") || !strcmp(o->base, "..")) {
        cli_out_abort(o);
        return cli_fail(c, "'%s' names a directory: name the file to write", path);
    }
    o->dirfd = open(o->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (o->dirfd < 0) {
        int e = errno;
        cli_out_abort(o);
        cli_fail(c, "cannot write '%s': its directory: %s", path, strerror(e));
        if (e == ENOENT) fprintf(stderr, "  hint: check the path\n");
        return CLI_FAIL;
    }
    clean_stale(o->dirfd);
    if (for_library) {
        /* The library seals its file under the temporary name; commit
         * renames it over the target. */
        unlinkat(o->dirfd, o->tmpname, 0); /* never another's: 64 random bits in the name */
        if (!(o->lib_path = join(o->dir, o->tmpname))) {
            cli_out_abort(o);
            return cli_fail(c, "out of memory");
        }
        return CLI_OK;
    }
    int fd = -1;
    if (access("/proc/self/fd", X_OK) == 0)
        fd = openat(o->dirfd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) {
        fd = openat(o->dirfd, o->tmpname, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd < 0 && errno == EEXIST) { /* a clash of 64 random bits: ours to replace */
            unlinkat(o->dirfd, o->tmpname, 0);
            fd = openat(o->dirfd, o->tmpname, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                        0644);
        }
        if (fd < 0) {
            int e = errno;
            cli_out_abort(o);
            return cli_fail(c, "cannot write '%s': %s", path, strerror(e));
        }
        o->named = 1;
    }
    o->fd = fd;
    /* Before the first byte: a 0600 file's bytes are never readable by
     * others, not even in the temporary. */
    if (o->keep_mode && fchmod(fd, o->mode) != 0) {
        int e = errno;
        cli_out_abort(o);
        return cli_fail(c, "cannot write '%s': cannot give the new file the mode %04o of the one "
                           "it replaces: %s", path, o->mode, strerror(e));
    }
    return CLI_OK;
}

int cli_out_write(const cli_cmd *c, cli_out *o, const void *data, size_t len)
{
    const unsigned char *p = data;
    size_t done = 0;
    while (done < len) {
        size_t chunk = len - done > ((size_t)1 << 30) ? (size_t)1 << 30 : len - done;
        ssize_t w = write(o->fd, p + done, chunk);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : EIO;
            if (e == EPIPE) cli_fail(c, "cannot write '%s': its reader closed it", o->path);
            else cli_fail(c, "cannot write '%s': %s", o->path, strerror(e));
            if (e == ENOSPC) fprintf(stderr, "  hint: %s\n", cli_hint(-ENOSPC));
            cli_out_abort(o);
            return CLI_FAIL;
        }
        done += (size_t)w;
    }
    return CLI_OK;
}

/* Puts the finished temporary file (o->tmpname in o->dirfd) at the target
 * name: only over a regular file or nothing, checked again now. */
static int publish(const cli_cmd *c, cli_out *o)
{
    if (o->keep_mode && o->lib_path) {
        /* The library made its file 0600: it takes the replaced file's
         * mode now, before it has the target's name. */
        int fd = openat(o->dirfd, o->tmpname, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        struct stat st;
        int ok = fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && fchmod(fd, o->mode) == 0;
        int e = errno;
        if (fd >= 0) close(fd);
        if (!ok)
            return cli_fail(c, "cannot write '%s': cannot give the new file the mode %04o of the "
                               "one it replaces: %s", o->path, o->mode, strerror(e));
    }
    for (int tries = 0;; tries++) {
        struct stat st;
        if (fstatat(o->dirfd, o->base, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno != ENOENT) return cli_fail(c, "cannot write '%s': %s", o->path, strerror(errno));
            if (renameat2(o->dirfd, o->tmpname, o->dirfd, o->base, RENAME_NOREPLACE) == 0) break;
            if (errno == EEXIST && tries < 3) continue; /* appeared meanwhile: look again */
            if (errno != EINVAL && errno != ENOSYS)
                return cli_fail(c, "cannot write '%s': %s", o->path, strerror(errno));
        } else if (!S_ISREG(st.st_mode)) {
            return cli_fail(c, "'%s' became %s while kvx wrote it: left as it is", o->path,
                            cli_file_type(st.st_mode));
        }
        if (renameat(o->dirfd, o->tmpname, o->dirfd, o->base) != 0)
            return cli_fail(c, "cannot write '%s': %s", o->path, strerror(errno));
        break;
    }
    o->named = 0;
    fsync(o->dirfd); /* the new name is durable */
    return CLI_OK;
}

/* Copies the library's finished file into the direct target. */
static int copy_in(const cli_cmd *c, cli_out *o)
{
    int in = open(o->lib_path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (in < 0) return cli_fail(c, "cannot read back '%s': %s", o->lib_path, strerror(errno));
    unlink(o->lib_path); /* the open descriptor keeps the bytes */
    size_t bs = (size_t)1 << 20;
    char *buf = malloc(bs);
    int rc = buf ? CLI_OK : cli_fail(c, "out of memory");
    while (rc == CLI_OK) {
        ssize_t r = read(in, buf, bs);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            rc = cli_fail(c, "cannot read back '%s': %s", o->lib_path, strerror(errno));
            break;
        }
        if (r == 0) break;
        if (cli_out_write(c, o, buf, (size_t)r) != CLI_OK) {
            free(buf);
            close(in);
            return CLI_FAIL; /* o is aborted */
        }
    }
    free(buf);
    close(in);
    return rc;
}

int cli_out_commit(const cli_cmd *c, cli_out *o)
{
    int rc = CLI_OK;
    if (o->direct) {
        if (o->lib_path) rc = copy_in(c, o);
    } else if (o->lib_path) {
        rc = publish(c, o);
    } else {
        if (fsync(o->fd) != 0) rc = cli_fail(c, "cannot write '%s': %s", o->path, strerror(errno));
        if (rc == CLI_OK && !o->named) {
            char proc[64];
            snprintf(proc, sizeof proc, "/proc/self/fd/%d", o->fd);
            /* Named only for the instant of the rename. */
            if (linkat(AT_FDCWD, proc, o->dirfd, o->tmpname, AT_SYMLINK_FOLLOW) != 0 &&
                (errno != EEXIST || unlinkat(o->dirfd, o->tmpname, 0) != 0 ||
                 linkat(AT_FDCWD, proc, o->dirfd, o->tmpname, AT_SYMLINK_FOLLOW) != 0))
                rc = cli_fail(c, "cannot write '%s': %s", o->path, strerror(errno));
            else
                o->named = 1;
        }
        if (rc == CLI_OK) rc = publish(c, o);
    }
    if (o->fd >= 0 && !o->is_stdout && close(o->fd) != 0 && rc == CLI_OK && o->direct)
        rc = cli_fail(c, "cannot write '%s': %s", o->path, strerror(errno));
    if (o->is_stdout && fflush(stdout) != 0 && rc == CLI_OK)
        rc = cli_fail(c, "cannot write to standard output");
    o->fd = -1;
    if (rc == CLI_OK) {
        free(o->lib_path); /* renamed or copied: nothing to remove */
        o->lib_path = NULL;
    }
    cli_out_abort(o);
    return rc;
}

int cli_write_output(const cli_cmd *c, const char *path, const void *data, size_t len)
{
    cli_out o;
    if (cli_out_open(c, &o, path, 0) != CLI_OK) return CLI_FAIL;
    if (cli_out_write(c, &o, data, len) != CLI_OK) return CLI_FAIL;
    return cli_out_commit(c, &o);
}
