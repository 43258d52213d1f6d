/* Vigil's shim over libfabric's static inline functions.
 *
 * Most of libfabric's API (fi_domain, fi_endpoint, fi_cq_open, fi_send, fi_recv, fi_cq_readfrom, fi_trywait...)
 * is static inline in the headers: each call goes through an ops table of the object it is given. Those
 * functions have no symbol in libfabric.so, so bindgen cannot bind them; this file gives each one we use a real
 * symbol, compiled against the installed headers, so the calls are exactly what a C program would make. */
#ifndef VIGIL_OFI_SHIM_H
#define VIGIL_OFI_SHIM_H

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

/* Load libfabric.so.1 with dlopen (once; the first call must not race another). NULL once loaded, else why not
 * (dlerror's text). Until it succeeds nothing else here may be called. */
const char *vigil_fi_load(void);

struct fi_info *vigil_fi_allocinfo(void);
int vigil_fi_close(struct fid *fid);
int vigil_fi_control(struct fid *fid, int command, void *arg);
int vigil_fi_domain(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **domain, void *context);
int vigil_fi_av_open(struct fid_domain *domain, struct fi_av_attr *attr, struct fid_av **av, void *context);
int vigil_fi_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr, struct fid_cq **cq, void *context);
int vigil_fi_endpoint(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep, void *context);
int vigil_fi_ep_bind(struct fid_ep *ep, struct fid *bfid, uint64_t flags);
int vigil_fi_enable(struct fid_ep *ep);
int vigil_fi_getname(struct fid *fid, void *addr, size_t *addrlen);
int vigil_fi_av_insert(struct fid_av *av, const void *addr, size_t count, fi_addr_t *fi_addr, uint64_t flags,
                       void *context);
int vigil_fi_av_remove(struct fid_av *av, fi_addr_t *fi_addr, size_t count, uint64_t flags);
const char *vigil_fi_av_straddr(struct fid_av *av, const void *addr, char *buf, size_t *len);
ssize_t vigil_fi_cq_readfrom(struct fid_cq *cq, void *buf, size_t count, fi_addr_t *src_addr);
ssize_t vigil_fi_cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf, uint64_t flags);
const char *vigil_fi_cq_strerror(struct fid_cq *cq, int prov_errno, const void *err_data, char *buf, size_t len);
int vigil_fi_trywait(struct fid_fabric *fabric, struct fid **fids, int count);
ssize_t vigil_fi_send(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest_addr,
                      void *context);
ssize_t vigil_fi_recv(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src_addr, void *context);

#endif
