# Shared with decode_step.pyx, whose layer decode step runs the same mat-vec groups from C.
from libc.stdint cimport int8_t, uint8_t

cdef struct QuantMat:
    int code            # the format's kernel code (quant.h's HY_Q_*)
    const uint8_t *w    # [n_out, row_bytes] encoded weight rows
    long row_bytes
    long n_out
    const float *bias   # [n_out] or NULL
    float *out          # [rows, n_out]

cdef struct SetInput:
    const float *x      # [rows, n_in] float32 input of one set of matrices
    int rows
    long n_in

cdef long check_weight(int qtype, const uint8_t[:, ::1] w, Py_ssize_t n_in) except -1
cdef Py_ssize_t acts_bytes(long rows, long n_in) noexcept nogil
cdef void matvec_group(const QuantMat *mats, int count, const float *x, long n_in, int rows,
                       uint8_t *acts, int num_threads) noexcept nogil
cdef Py_ssize_t sets_work_bytes(int ns, long rows, long n_in) noexcept nogil
cdef int matvec_sets_run(const QuantMat *mats, int count, const int *set_of,
                         const SetInput *ins, int ns, uint8_t *work, Py_ssize_t work_bytes,
                         int num_threads) noexcept nogil
