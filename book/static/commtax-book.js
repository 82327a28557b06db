/* The calculators' widget manager (@jupyter-widgets/html-manager) typesets widget labels through
   MathJax 2's API, MathJax.Hub.Queue(["Typeset", MathJax.Hub, element]); the book serves MathJax 3.
   Loaded deferred after MathJax and before the widgets are drawn (on "load"), this answers the old
   call with MathJax 3's typesetPromise. On a page without formulas there is no MathJax: nothing to do. */
(function () {
  const mathjax = window.MathJax;
  if (!mathjax || mathjax.Hub) return;
  mathjax.Hub = {
    Queue: function (job) {
      const element = Array.isArray(job) ? job[2] : undefined;
      if (!element || !mathjax.startup || !mathjax.startup.promise) return;
      mathjax.startup.promise
        .then(function () { return mathjax.typesetPromise([element]); })
        .catch(function (error) { console.warn("MathJax could not typeset a widget label:", error); });
    },
  };
})();
