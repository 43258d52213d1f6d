/* See shim.h: one real symbol per libfabric static inline function Vigil calls. */
#include "shim.h"

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
