/* See shim.h: one real symbol per libfabric static inline function Vigil calls.
 *
 * libfabric is loaded with dlopen, not linked: loading it runs its providers' library constructors, and Debian's
 * (linked with the PSM libraries) spends ~0.2 s in them, which every `vigil` command would pay at start. So the
 * few functions libfabric really exports, that Vigil (or an inline function of the headers: fi_allocinfo calls
 * fi_dupinfo) calls, are defined here, forwarding to the library's own once vigil_fi_load has found them. The
 * executable does not export these names (nothing links against it), so libfabric's own calls stay its own. */
#include <dlfcn.h>
#include <stddef.h>
#include "shim.h"

static int (*p_getinfo)(uint32_t, const char *, const char *, uint64_t, const struct fi_info *, struct fi_info **);
static void (*p_freeinfo)(struct fi_info *);
static struct fi_info *(*p_dupinfo)(const struct fi_info *);
static int (*p_fabric)(struct fi_fabric_attr *, struct fid_fabric **, void *);
static const char *(*p_strerror)(int);
static uint32_t (*p_version)(void);
static int loaded;

const char *vigil_fi_load(void)
{
	if (loaded)
		return NULL;
	void *lib = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		return dlerror();
	*(void **)&p_getinfo = dlsym(lib, "fi_getinfo");
	*(void **)&p_freeinfo = dlsym(lib, "fi_freeinfo");
	*(void **)&p_dupinfo = dlsym(lib, "fi_dupinfo");
	*(void **)&p_fabric = dlsym(lib, "fi_fabric");
	*(void **)&p_strerror = dlsym(lib, "fi_strerror");
	*(void **)&p_version = dlsym(lib, "fi_version");
	if (!p_getinfo || !p_freeinfo || !p_dupinfo || !p_fabric || !p_strerror || !p_version)
		return "libfabric.so.1 lacks one of fi_getinfo, fi_freeinfo, fi_dupinfo, fi_fabric, fi_strerror, fi_version";
	loaded = 1;
	return NULL;
}

int fi_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags, const struct fi_info *hints,
	       struct fi_info **info)
{
	return p_getinfo(version, node, service, flags, hints, info);
}
void fi_freeinfo(struct fi_info *info) { p_freeinfo(info); }
struct fi_info *fi_dupinfo(const struct fi_info *info) { return p_dupinfo(info); }
int fi_fabric(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context)
{
	return p_fabric(attr, fabric, context);
}
const char *fi_strerror(int errnum) { return p_strerror(errnum); }
uint32_t fi_version(void) { return p_version(); }

struct fi_info *vigil_fi_allocinfo(void) { return fi_allocinfo(); }
int vigil_fi_close(struct fid *fid) { return fi_close(fid); }
int vigil_fi_control(struct fid *fid, int command, void *arg) { return fi_control(fid, command, arg); }
int vigil_fi_domain(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **domain, void *context)
{
	return fi_domain(fabric, info, domain, context);
}
int vigil_fi_av_open(struct fid_domain *domain, struct fi_av_attr *attr, struct fid_av **av, void *context)
{
	return fi_av_open(domain, attr, av, context);
}
int vigil_fi_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr, struct fid_cq **cq, void *context)
{
	return fi_cq_open(domain, attr, cq, context);
}
int vigil_fi_endpoint(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep, void *context)
{
	return fi_endpoint(domain, info, ep, context);
}
int vigil_fi_ep_bind(struct fid_ep *ep, struct fid *bfid, uint64_t flags) { return fi_ep_bind(ep, bfid, flags); }
int vigil_fi_enable(struct fid_ep *ep) { return fi_enable(ep); }
int vigil_fi_getname(struct fid *fid, void *addr, size_t *addrlen) { return fi_getname(fid, addr, addrlen); }
int vigil_fi_av_insert(struct fid_av *av, const void *addr, size_t count, fi_addr_t *fi_addr, uint64_t flags,
                       void *context)
{
	return fi_av_insert(av, addr, count, fi_addr, flags, context);
}
int vigil_fi_av_remove(struct fid_av *av, fi_addr_t *fi_addr, size_t count, uint64_t flags)
{
	return fi_av_remove(av, fi_addr, count, flags);
}
const char *vigil_fi_av_straddr(struct fid_av *av, const void *addr, char *buf, size_t *len)
{
	return fi_av_straddr(av, addr, buf, len);
}
ssize_t vigil_fi_cq_readfrom(struct fid_cq *cq, void *buf, size_t count, fi_addr_t *src_addr)
{
	return fi_cq_readfrom(cq, buf, count, src_addr);
}
ssize_t vigil_fi_cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf, uint64_t flags)
{
	return fi_cq_readerr(cq, buf, flags);
}
const char *vigil_fi_cq_strerror(struct fid_cq *cq, int prov_errno, const void *err_data, char *buf, size_t len)
{
	return fi_cq_strerror(cq, prov_errno, err_data, buf, len);
}
int vigil_fi_trywait(struct fid_fabric *fabric, struct fid **fids, int count)
{
	return fi_trywait(fabric, fids, count);
}
ssize_t vigil_fi_send(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest_addr,
                      void *context)
{
	return fi_send(ep, buf, len, desc, dest_addr, context);
}
ssize_t vigil_fi_recv(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src_addr, void *context)
{
	return fi_recv(ep, buf, len, desc, src_addr, context);
}
