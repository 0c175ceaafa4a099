/*
 * cmd_tier.c - `kvx store tier DIR set URL | off | show`: a store's shared
 * tier setting (DIR/TIER, docs/TIER.md).
 *
 * set and off are writer commands (they take the writer lock: --wait /
 * --no-wait, as reindex and gc); show opens the store read-only and asks
 * the tier once (PING, within the tier's limits), so it says whether the
 * tier answers now. None of them fails because the tier is down.
 */
#include "cli.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static int tier_show(const cli_cmd *self, const char *dir, int json)
{
    kvx_store *s = NULL;
    if (cli_store_open_reader(self, &s, dir) != CLI_OK) return CLI_FAIL;
    kvx_store_tier t;
    int rc = kvx_store_tier_get(&t, s);
    int up = rc == 0 && t.url[0] && kvx_store_tier_ping(s) == 0;
    if (rc == 0 && t.url[0]) kvx_store_tier_get(&t, s); /* the ping learned cluster or not */
    kvx_store_close(s);
    if (rc) return cli_fail_code(self, rc, "cannot read the tier setting of '%s'", dir);
    if (json) {
        cli_json j;
        cli_json_init(&j, stdout);
        cli_json_obj_begin(&j);
        cli_json_key(&j, "url");
        cli_json_str(&j, t.url);
        cli_json_key(&j, "tenant");
        cli_json_str(&j, t.tenant);
        cli_json_key(&j, "ttl_ms");
        cli_json_u64(&j, t.ttl_ms);
        cli_json_key(&j, "namespace");
        cli_json_hex(&j, t.ns, 16);
        cli_json_key(&j, "kind");
        cli_json_str(&j, t.cluster == 1 ? "cluster" : t.cluster == 0 ? "single" : "unknown");
        cli_json_key(&j, "up");
        cli_json_u64(&j, (uint64_t)up);
        cli_json_obj_end(&j);
        cli_json_finish(&j);
        return CLI_OK;
    }
    if (!t.url[0]) {
        printf("tier       none\n");
        return CLI_OK;
    }
    printf("tier       %s\n", t.url);
    printf("tenant     %s\n", t.tenant[0] ? t.tenant : "(none)");
    if (t.ttl_ms) printf("ttl        %" PRIu64 " ms\n", t.ttl_ms);
    else printf("ttl        none\n");
    printf("namespace  kvx:1:%016" PRIx64 ":*\n", t.ns);
    printf("state      %s%s\n", up ? "up" : "DOWN (lookups miss it; nothing fails)",
           !up ? "" : t.cluster == 1 ? ", Redis Cluster" : t.cluster == 0 ? ", one Redis" : "");
    return CLI_OK;
}

static int run_tier(const cli_cmd *self, int argc, char **argv)
{
    static const struct option opts[] = {
        {"tenant", required_argument, NULL, 'n'},
        {"tier-ttl", required_argument, NULL, 't'},
        {"json", no_argument, NULL, 'j'},
        {"wait", required_argument, NULL, 'W'},
        {"no-wait", no_argument, NULL, 'N'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *tenant = NULL;
    uint64_t ttl = 0;
    double wait = -1;
    int json = 0, ch, have_ttl = 0;
    cli_getopt_reset();
    while ((ch = getopt_long(argc, argv, ":jh", opts, NULL)) != -1) {
        switch (ch) {
        case 'n': tenant = optarg; break;
        case 't':
            if (cli_parse_tier_ttl(self, optarg, &ttl) != CLI_OK) return CLI_USAGE;
            have_ttl = 1;
            break;
        case 'j': json = 1; break;
        case 'W':
        case 'N':
            if (cli_store_parse_wait(self, ch, optarg, &wait) != CLI_OK) return CLI_USAGE;
            break;
        case 'h': cli_print_help(self); return CLI_OK;
        default: return cli_getopt_error(self, ch, argv, opts);
        }
    }
    int nargs = argc - optind;
    if (nargs < 2) return cli_usage(self, "expected DIR and set URL, off or show");
    const char *dir = argv[optind], *verb = argv[optind + 1];
    if (!strcmp(verb, "show")) {
        if (nargs != 2) return cli_usage(self, "show takes no argument");
        return tier_show(self, dir, json);
    }
    int set = !strcmp(verb, "set");
    if (!set && strcmp(verb, "off")) return cli_usage(self, "unknown tier command '%s' (set URL, off or show)", verb);
    if (set && nargs != 3) return cli_usage(self, "set takes one URL");
    if (!set && nargs != 2) return cli_usage(self, "off takes no argument");
    if (!set && (tenant || have_ttl)) return cli_usage(self, "--tenant and --tier-ttl go with set");
    kvx_store *s = NULL;
    if (cli_store_open_writer(self, &s, dir, wait) != CLI_OK) return CLI_FAIL;
    int rc = kvx_store_tier_set(s, set ? argv[optind + 2] : NULL, tenant, ttl);
    if (rc == KVX_EINVALID) {
        char why[512];
        snprintf(why, sizeof why, "%s", kvx_last_error());
        kvx_store_close(s);
        return cli_usage(self, "%s", why);
    }
    /* the URL as the store keeps it for showing: its password redacted */
    kvx_store_tier t;
    char shown[sizeof t.url] = "";
    if (rc == 0 && set && kvx_store_tier_get(&t, s) == 0) snprintf(shown, sizeof shown, "%s", t.url);
    kvx_store_close(s);
    if (rc) return cli_fail_code(self, rc, "cannot write %s/TIER", dir);
    if (set) printf("tier of %s: %s\n", dir, shown);
    else printf("tier of %s: off\n", dir);
    return CLI_OK;
}

const cli_cmd cli_cmd_store_tier = {
    "store tier",
    "the store's shared tier (Redis): set URL, off, show",
    "Usage: kvx store tier DIR set URL [--tenant NAME] [--tier-ttl DURATION]\n"
    "                                  [--wait SECONDS | --no-wait]\n"
    "       kvx store tier DIR off [--wait SECONDS | --no-wait]\n"
    "       kvx store tier DIR show [--json]\n"
    "\n"
    "A store may sit above a shared tier, Redis Cluster or one Redis\n"
    "(docs/TIER.md): flushed blocks are written behind to it, and a prefix\n"
    "lookup that misses locally continues into it, every value verified.\n"
    "The setting lives in DIR/TIER (written atomically; kept by reindex).\n"
    "set and off take the writer lock; show opens the store read-only and\n"
    "asks the tier once whether it answers.\n"
    "\n"
    "URL: redis://[user[:pass]@]host[:port][,host[:port]...] (a seed list;\n"
    "a cluster's other nodes are found with CLUSTER SLOTS). No TLS.\n"
    "\n"
    "Options:\n"
    "      --tenant NAME      namespace salt ([A-Za-z0-9._-]): stores of other\n"
    "                         tenants never see these blocks\n"
    "      --tier-ttl DURATION  TTL of the values written: digits and a unit\n"
    "                         (3600, 250ms, 90s, 30m, 12h, 7d), at most\n"
    "                         2^62 ms; default none\n"
    "  -j, --json             show: one JSON object: url, tenant, ttl_ms,\n"
    "                         namespace, kind (cluster|single|unknown), up\n"
    "      --wait SECONDS     give up (exit 1) when another writer still holds\n"
    "                         the store after SECONDS (default: wait)\n"
    "      --no-wait          fail at once (exit 1) when another writer holds it\n"
    "  -h, --help             show this help\n"
    "\n"
    "Exit status: 0 success (a tier that is down is no failure), 1 failure,\n"
    "2 usage error.\n",
    run_tier,
};
