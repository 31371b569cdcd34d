/*
 * nullfs.c — the floor of a FUSE data path: a libfuse low-level file system
 * in C, one thread, that keeps nothing.  Files can be created in its root;
 * a write is answered with its size at once, a read with zeros up to the
 * size written so far; rename and unlink change the table (no directories:
 * the benchmark puts its files in the root).  `memosfs bench clients` mounts it beside tmpfs and
 * memosfs, so what the kernel's round trip alone costs a client pattern is
 * measured in the same run (what no FUSE file system without the kernel's
 * writeback cache can go below).
 *
 *   nullfs MOUNTPOINT        (stays in the foreground; fusermount3 -u ends it)
 */
#define FUSE_USE_VERSION 34
#include <errno.h>
#include <fuse_lowlevel.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAXF 65536
static struct { char name[256]; off_t size; int used; } files[MAXF];
static int nfiles;

static void fill(fuse_ino_t ino, struct stat *st)
{
    memset(st, 0, sizeof *st);
    st->st_ino = ino;
    st->st_uid = getuid();
    st->st_gid = getgid();
    if (ino == FUSE_ROOT_ID) {
        st->st_mode = S_IFDIR | 0755;
        st->st_nlink = 2;
    } else {
        st->st_mode = S_IFREG | 0644;
        st->st_nlink = 1;
        st->st_size = files[ino - 2].size;
    }
}

static void reply_entry(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct fuse_entry_param e;
    memset(&e, 0, sizeof e);
    e.ino = ino;
    e.attr_timeout = 1.0;
    e.entry_timeout = 1.0;
    fill(ino, &e.attr);
    if (fi)
        fuse_reply_create(req, &e, fi);
    else
        fuse_reply_entry(req, &e);
}

static void nf_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    for (int i = 0; i < nfiles; i++)
        if (files[i].used && !strcmp(files[i].name, name)) {
            reply_entry(req, (fuse_ino_t)i + 2, NULL);
            return;
        }
    fuse_reply_err(req, ENOENT);
}

static void nf_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct stat st;
    fill(ino, &st);
    fuse_reply_attr(req, &st, 1.0);
}

static void nf_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                       struct fuse_file_info *fi)
{
    if (ino != FUSE_ROOT_ID && (to_set & FUSE_SET_ATTR_SIZE))
        files[ino - 2].size = attr->st_size;
    nf_getattr(req, ino, fi);
}

static void nf_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                      struct fuse_file_info *fi)
{
    if (nfiles >= MAXF || strlen(name) >= sizeof files[0].name) {
        fuse_reply_err(req, ENOSPC);
        return;
    }
    strcpy(files[nfiles].name, name);
    files[nfiles].size = 0;
    files[nfiles].used = 1;
    nfiles++;
    reply_entry(req, (fuse_ino_t)nfiles + 1, fi);
}

static void nf_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    if (fi->flags & O_TRUNC)
        files[ino - 2].size = 0;
    fi->keep_cache = 0;
    fuse_reply_open(req, fi);
}

static void nf_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
                     struct fuse_file_info *fi)
{
    if (off + (off_t)size > files[ino - 2].size)
        files[ino - 2].size = off + (off_t)size;
    fuse_reply_write(req, size);
}

static char zeros[1 << 20];

static void nf_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                    struct fuse_file_info *fi)
{
    off_t end = files[ino - 2].size;
    size_t n = off >= end ? 0 : (size_t)(end - off);
    if (n > size)
        n = size;
    if (n > sizeof zeros)
        n = sizeof zeros;
    fuse_reply_buf(req, zeros, n);
}

static void nf_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    for (int i = 0; i < nfiles; i++)
        if (files[i].used && !strcmp(files[i].name, name)) {
            files[i].used = 0;
            fuse_reply_err(req, 0);
            return;
        }
    fuse_reply_err(req, ENOENT);
}

static void nf_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
                      fuse_ino_t newparent, const char *newname, unsigned int flags)
{
    int from = -1;
    if (strlen(newname) >= sizeof files[0].name) {
        fuse_reply_err(req, ENAMETOOLONG);
        return;
    }
    for (int i = 0; i < nfiles; i++)
        if (files[i].used && !strcmp(files[i].name, name))
            from = i;
    if (from < 0) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    for (int i = 0; i < nfiles; i++)
        if (i != from && files[i].used && !strcmp(files[i].name, newname))
            files[i].used = 0;
    strcpy(files[from].name, newname);
    fuse_reply_err(req, 0);
}

static void nf_ok(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    fuse_reply_err(req, 0);
}

static void nf_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
    fuse_reply_err(req, 0);
}

static const struct fuse_lowlevel_ops ops = {
    .lookup = nf_lookup, .getattr = nf_getattr, .setattr = nf_setattr,
    .create = nf_create, .open = nf_open, .write = nf_write, .read = nf_read,
    .unlink = nf_unlink, .rename = nf_rename, .flush = nf_ok, .release = nf_ok, .fsync = nf_fsync,
};

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: nullfs MOUNTPOINT\n");
        return 2;
    }
    char *av[] = { argv[0], NULL };
    struct fuse_args args = FUSE_ARGS_INIT(1, av);
    struct fuse_session *se = fuse_session_new(&args, &ops, sizeof ops, NULL);
    if (!se || fuse_session_mount(se, argv[1]) != 0)
        return 1;
    int rc = fuse_session_loop(se);
    fuse_session_unmount(se);
    fuse_session_destroy(se);
    return rc ? 1 : 0;
}
